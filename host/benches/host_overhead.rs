//! The host's own overhead per request: the real router (validation, queue, answer math,
//! serialisation, middleware) over real HTTP, in front of a reader that answers instantly.
//!
//!     cargo bench -p hunch --bench host_overhead                 # release, the real numbers
//!     cargo bench -p hunch --bench host_overhead --profile dev   # quick, reuses the test build
//!
//! `BENCH_N` requests per client (default 2000). Prints p50/p99 latency and requests/s with 16
//! concurrent clients and the machine's core count. The clients run on the same machine, so the
//! figures are an upper bound on the overhead. Not a test: it prints numbers and asserts nothing.

use hunch::api::{router, ApiKeys, AppState, Limits};
use hunch::policy::testing::InstantReader;
use hunch::reader::{ModelEntry, Registry};
use std::sync::Arc;
use std::time::Instant;

mod common;
use common::{percentile, samples_from_env};

const CLIENTS: usize = 16;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let per_client = samples_from_env();
    let mut registry = Registry::new();
    registry.add(ModelEntry {
        name: "instant".into(),
        description: "answers instantly".into(),
        release_date: "2026-01-01".into(),
        reader: Arc::new(InstantReader::uniform()),
    })?;
    let limits = Limits {
        max_concurrent_reads: CLIENTS,
        max_queued_reads: CLIENTS * 4,
        ..Limits::default()
    };
    let state = AppState::new(registry, limits, ApiKeys::default()).map_err(anyhow::Error::msg)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1/systemone", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router(state)).await });

    let body = serde_json::to_vec(&serde_json::json!({
        "model": "jev-latest",
        "state": {"ticket": "I was charged twice for my subscription this month.", "tier": "gold"},
        "questions": {
            "billing": {"type": "noul", "instructions": "Is this about billing?"},
            "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "Payments", "technical": null, "sales": "New purchases"}},
            "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["Can wait", "This week", "Today"]}
        }
    }))?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS)
        .build()?;
    let post = |client: reqwest::Client, url: String, body: Vec<u8>| async move {
        let r = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        anyhow::ensure!(r.status() == 200, "status {}", r.status());
        r.bytes().await?;
        anyhow::Ok(())
    };
    // Warm up connections and caches.
    for _ in 0..50 {
        post(client.clone(), url.clone(), body.clone()).await?;
    }
    let started = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_client);
                for _ in 0..per_client {
                    let t = Instant::now();
                    post(client.clone(), url.clone(), body.clone()).await?;
                    latencies.push(t.elapsed().as_secs_f64() * 1e3);
                }
                anyhow::Ok(latencies)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let wall = started.elapsed();
    all.sort_by(f64::total_cmp);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "hunch host overhead ({} requests, {CLIENTS} concurrent clients, 3 questions each, instant \
         reader, {cores} cores, {} build, clients on the same machine):",
        all.len(),
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
    println!(
        "  p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms",
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        percentile(&all, 1.0)
    );
    println!("  {:.0} requests/s", all.len() as f64 / wall.as_secs_f64());
    Ok(())
}
