//! Draining on SIGTERM (docs/deploy.md, "Draining"): the server turns unready at once, keeps
//! serving through the drain delay, then refuses new connections while the request in flight
//! finishes with 200, flushes the decision log (both decisions are in it) and exits 0.
//!
//! The fixture sidecar answers after `__sleep_ms` in the state, which makes the slow request.

use hunch_e2e::http::{metric, post_systemone};
use hunch_e2e::{sample_request, start_hunch_with_fixture};
use serde_json::{json, Value};
use std::time::Duration;

fn with_state(state: &str) -> Value {
    let mut r = sample_request();
    r["state"] = json!(state);
    r
}

/// A fresh connection per call, so "refused" means the listener is closed, not a pooled
/// connection being reused.
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a client")
}

fn decision_id(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("x-hunch-decision-id")
        .and_then(|v| v.to_str().ok())
        .expect("every answer names its decision")
        .to_string()
}

#[tokio::test]
async fn sigterm_turns_unready_serves_the_delay_finishes_in_flight_flushes_and_exits_0() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("decisions.jsonl");
    let log_arg = log.to_string_lossy().into_owned();
    let mut hunch = start_hunch_with_fixture(
        "dg-drain",
        &["--drain-delay", "2", "--decision-log", &log_arg],
    )
    .await;
    let url = hunch.url.clone();
    assert_eq!(metric::<u64>(&url, "hunch_draining ").await, 0);

    // A slow request in flight when the signal comes: it outlives the drain delay.
    let slow_url = url.clone();
    let slow = tokio::spawn(async move {
        let r = post_systemone(&slow_url, &with_state("__sleep_ms=6000 a slow one")).await;
        (r.status().as_u16(), decision_id(&r))
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    hunch.process.terminate();

    // 1. Unready at once; the metrics say why.
    let client = fresh_client();
    let mut unready = None;
    for _ in 0..100 {
        let r = client
            .get(format!("{url}/readyz"))
            .send()
            .await
            .expect("still listening");
        if r.status() == 503 {
            unready = Some(r.text().await.unwrap_or_default());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let unready = unready.expect("/readyz turns 503 on SIGTERM");
    assert!(unready.contains("draining"), "{unready}");
    assert_eq!(metric::<u64>(&url, "hunch_draining ").await, 1);

    // 2. Within the drain delay new work is still served (balancers have not all noticed yet).
    let late = post_systemone(&url, &with_state("arrived during the drain delay")).await;
    assert_eq!(
        late.status(),
        200,
        "a request during the drain delay is served"
    );
    let late_id = decision_id(&late);

    // 3. After the delay the listener closes while the slow request is still running.
    let mut refused_while_in_flight = false;
    for _ in 0..400 {
        if client.get(format!("{url}/healthz")).send().await.is_err() {
            refused_while_in_flight = !slow.is_finished();
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        refused_while_in_flight,
        "new connections are refused after the drain delay, before in-flight work is done"
    );

    // 4. The request in flight finishes with 200; the process exits 0.
    let (status, slow_id) = slow.await.expect("the slow request's task");
    assert_eq!(status, 200, "the in-flight request was drained");
    let exit = hunch
        .process
        .wait_exit(Duration::from_secs(30))
        .expect("hunch exits after draining");
    assert!(exit.success(), "{exit:?}\n{}", hunch.process.logs());

    // 5. The decision log was flushed: both decisions are in the file.
    let text = std::fs::read_to_string(&log).expect("the decision log exists");
    for id in [&slow_id, &late_id] {
        assert!(
            text.lines().any(|line| line.contains(id.as_str())),
            "decision {id} is in the log:\n{text}"
        );
    }
    let logs = hunch.process.logs();
    assert!(logs.contains("decision log flushed"), "{logs}");
}
