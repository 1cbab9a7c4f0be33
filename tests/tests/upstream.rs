//! hunch A (fixture sidecar) ← upstream ← hunch B: B's answers are A's, recomputed from A's
//! probabilities alone; A's errors reach B's clients as B's own.

use hunch_e2e::{sample_request, start_hunch, start_hunch_with_fixture, wait_ready};
use serde_json::{json, Value};
use std::time::Duration;

async fn post(url: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/systemone"))
        .json(body)
        .send()
        .await
        .expect("sent");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn answers_through_an_upstream_are_identical() {
    let a = start_hunch_with_fixture("dg-a", &["--api-key", "a-key"]).await;
    let upstream = format!("relay=jev-latest@{}", a.url);
    let b = start_hunch(&["--upstream", &upstream, "--upstream-key", "a-key"]);
    wait_ready(&b.url, Duration::from_secs(10)).await;

    let mut request = sample_request();
    request["questions"]["one sided"] =
        json!({"type": "noul", "criteria": {"false": {"not": "billing"}}});
    request["questions"]["object levels"] = json!({"type": "score", "instructions": ["rate", 1],
                                                   "criteria": ["low", {"mid": true}, "high"]});
    request["questions"]["single"] = json!({"type": "choice", "criteria": {"only": null}});
    let direct = {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/systemone", a.url))
            .bearer_auth("a-key")
            .json(&request)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json::<Value>().await.unwrap()
    };
    let (status, relayed) = post(&b.url, &request).await;
    assert_eq!(status, 200, "{relayed}");
    assert_eq!(relayed["model"], "relay");
    assert_eq!(direct["model"], "dg-a");
    for (id, answer) in direct["answers"].as_object().unwrap() {
        let other = &relayed["answers"][id];
        assert_eq!(answer["type"], other["type"], "{id}");
        for field in ["choice", "legend"] {
            assert_eq!(answer[field], other[field], "{id}.{field}");
        }
        for field in ["noul", "confidence", "score"] {
            if let (Some(x), Some(y)) = (answer[field].as_f64(), other[field].as_f64()) {
                assert!((x - y).abs() < 1e-12, "{id}.{field}: {x} vs {y}");
            }
        }
    }
    assert_eq!(direct["usage"], relayed["usage"]);

    // A reader error on A names the caller's question on B.
    let (status, body) = post(
        &b.url,
        &json!({"model": "relay", "state": "s", "questions": {
            "fine": {"type": "noul", "instructions": "?"},
            "my odd question": {"type": "choice", "criteria": {"__unreadable__": null, "b": null}}}}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        body["detail"][0]["loc"],
        json!(["body", "questions", "my odd question"])
    );
    let (status, _) = post(&b.url, &json!({"model": "relay", "state": "__too_large__",
                                            "questions": {"q": {"type": "noul", "instructions": "?"}}})).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn upstream_errors_map_to_ours() {
    let a = start_hunch_with_fixture("dg-a", &["--api-key", "a-key"]).await;
    // Wrong key: A's 401 is B's configuration problem, passed through as a 4xx (never retried).
    let wrong = start_hunch(&[
        "--upstream",
        &format!("relay=jev-latest@{}", a.url),
        "--upstream-key",
        "nope",
    ]);
    let (status, _) = post(&wrong.url, &sample_request()).await;
    assert_eq!(status, 401);
    // Unknown model upstream: 404.
    let unknown = start_hunch(&[
        "--upstream",
        &format!("relay=missing@{}", a.url),
        "--upstream-key",
        "a-key",
    ]);
    let (status, _) = post(&unknown.url, &sample_request()).await;
    assert_eq!(status, 404);
    // Nothing listening: 503 with Retry-After.
    let dead = start_hunch(&["--upstream", "relay=http://127.0.0.1:9"]);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/systemone", dead.url))
        .json(&sample_request())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
}
