//! The decision log's spool end to end (docs/decision-records.md, "Spool"): with
//! `--decision-log-spool`, every decision answered 200 reaches the collector — after the
//! collector was down for longer than a sink without a spool retries, and after the server was
//! killed (SIGKILL) and started again on the same spool. Delivery is at-least-once, so the
//! collector's side deduplicates by `decision_id`, as a real collector would.

use hunch_e2e::http::{metric, post_json};
use hunch_e2e::{sample_request, start_hunch_with_fixture, Hunch};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Failed POSTs after which a sink without a spool has given a batch up (it tries 6 times).
const MORE_THAN_THE_RETRIES: u64 = 7;

async fn spooled_server(collector: &str, spool: &Path) -> Hunch {
    let dir = spool.display().to_string();
    start_hunch_with_fixture(
        "dg-test",
        &[
            "--decision-log-url",
            collector,
            "--decision-log-spool",
            &dir,
        ],
    )
    .await
}

/// Asks `n` System One questions; the decision ids of those answered 200 (all of them).
async fn decide(url: &str, n: usize) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for i in 0..n {
        let (s, h, body) = post_json(&format!("{url}/v1/systemone"), &sample_request(), &[]).await;
        assert_eq!(s, 200, "decision {i}: {body}");
        let id = h["x-hunch-decision-id"].to_str().unwrap().to_string();
        ids.insert(id);
    }
    ids
}

/// The distinct decision ids the collector holds (it deduplicates, as at-least-once asks).
fn collected(seen: &Arc<Mutex<Vec<Value>>>) -> BTreeSet<String> {
    seen.lock()
        .unwrap()
        .iter()
        .filter_map(|e| e["decision_id"].as_str().map(str::to_string))
        .collect()
}

/// Waits until the collector holds every id of `answered`.
async fn until_collected(seen: &Arc<Mutex<Vec<Value>>>, answered: &BTreeSet<String>) {
    let start = Instant::now();
    loop {
        let got = collected(seen);
        if answered.is_subset(&got) {
            return;
        }
        let missing = answered.difference(&got).count();
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{missing} of {} answered decisions never reached the collector",
            answered.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A loopback address nothing listens on (yet).
async fn closed_port() -> std::net::SocketAddr {
    let probe = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    addr
}

#[tokio::test]
async fn a_collector_down_longer_than_the_retries_still_receives_every_answered_decision() {
    let spool = tempfile::tempdir().unwrap();
    let addr = closed_port().await;
    let hunch = spooled_server(&format!("http://{addr}/"), spool.path()).await;
    let answered = decide(&hunch.url, 20).await;

    // The collector stays down until the server has failed to send more often than a sink
    // without a spool tries before it drops; nothing is dropped, all of it waits in the spool.
    let start = Instant::now();
    while metric::<u64>(
        &hunch.url,
        "hunch_decision_log_send_failures_total{sink=\"http\"}",
    )
    .await
        < MORE_THAN_THE_RETRIES
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no retries counted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        metric::<u64>(&hunch.url, "hunch_decision_events_dropped_total").await,
        0
    );
    assert_eq!(
        metric::<u64>(&hunch.url, "hunch_decision_log_spool_events").await,
        20
    );

    // The collector comes back on its address: every answered decision arrives.
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let (_, seen) = hunch::decision::testing::recording_collector_on(listener);
    until_collected(&seen, &answered).await;
    let start = Instant::now();
    while metric::<u64>(&hunch.url, "hunch_decision_log_spool_events").await > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the spool never emptied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric::<u64>(&hunch.url, "hunch_decision_events_dropped_total").await,
        0
    );
    assert_eq!(
        metric::<u64>(
            &hunch.url,
            "hunch_decision_events_written_total{sink=\"http\"}"
        )
        .await,
        20
    );
    let received = seen.lock().unwrap().len();
    eprintln!(
        "collector down: {} answered, {received} events received, {} distinct",
        answered.len(),
        collected(&seen).len()
    );
}

#[tokio::test]
async fn a_server_killed_after_answering_sends_those_decisions_once_restarted_on_its_spool() {
    let spool = tempfile::tempdir().unwrap();
    // The first run's collector is down, so nothing it answered is acknowledged when it dies.
    let down = format!("http://{}/", closed_port().await);
    let mut first = spooled_server(&down, spool.path()).await;
    let mut answered = decide(&first.url, 15).await;
    // SIGKILL: no shutdown, no flush.
    first.process.child.kill().unwrap();
    first.process.child.wait().unwrap();

    let (url, seen) = hunch::decision::testing::recording_collector().await;
    let mut second = spooled_server(&url, spool.path()).await;
    answered.extend(decide(&second.url, 5).await);
    until_collected(&seen, &answered).await;
    assert_eq!(
        metric::<u64>(&second.url, "hunch_decision_events_dropped_total").await,
        0
    );

    // Killed again right after answering, this time with the collector up: some batches were
    // sent (maybe without their acknowledgement persisted), some not; every answered decision
    // arrives once the server is back, some perhaps twice.
    answered.extend(decide(&second.url, 10).await);
    second.process.child.kill().unwrap();
    second.process.child.wait().unwrap();
    let third = spooled_server(&url, spool.path()).await;
    until_collected(&seen, &answered).await;
    assert_eq!(
        metric::<u64>(&third.url, "hunch_decision_events_dropped_total").await,
        0
    );
    let received = seen.lock().unwrap().len();
    eprintln!(
        "killed and restarted: {} answered, {received} events received, {} distinct",
        answered.len(),
        collected(&seen).len()
    );
}
