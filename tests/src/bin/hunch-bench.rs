//! Benchmark of the host's own overhead per request: the real router (validation, queue, answer
//! math, serialisation, middleware) over real HTTP, in front of a reader that answers instantly.
//! Not a test; run `cargo run --release -p hunch-e2e --bin hunch-bench [-- REQUESTS_PER_CLIENT]`.
//!
//! Prints p50/p99 latency and requests/s with 16 concurrent clients and the machine's core count.
//! The clients run on the same machine, so the figures are an upper bound on the overhead.

use hunch::api::{router, ApiKeys, AppState, Limits};
use hunch::reader::{ModelEntry, Registry};
use hunch_core::{
    LabelDistribution, ReadError, ReadOutcome, ReadRequest, ReadStats, Reader, Usage,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: usize = 16;

/// Answers every question uniformly, at once.
struct InstantReader;

#[async_trait::async_trait]
impl Reader for InstantReader {
    fn model_name(&self) -> &str {
        "instant"
    }
    fn info(&self) -> hunch_core::ReaderInfo {
        hunch_core::ReaderInfo::unknown()
    }
    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        Ok(ReadOutcome {
            distributions: request
                .questions
                .iter()
                .map(|q| LabelDistribution(vec![1.0; q.label_count()]))
                .collect(),
            usage: Usage {
                input_tokens: 100,
                output_tokens: request.questions.len() as u64,
            },
            stats: ReadStats {
                reads: 1,
                draws: 1,
                ..ReadStats::default()
            },
        })
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let per_client: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(500);
    let mut registry = Registry::new();
    registry.add(ModelEntry {
        name: "instant".into(),
        description: "answers instantly".into(),
        release_date: "2026-01-01".into(),
        reader: Arc::new(InstantReader),
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
    // Warm up connections and caches.
    for _ in 0..50 {
        client
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await?
            .bytes()
            .await?;
    }
    let started = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let client = client.clone();
            let url = url.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_client);
                for _ in 0..per_client {
                    let t = Instant::now();
                    let r = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await?;
                    anyhow::ensure!(r.status() == 200, "status {}", r.status());
                    r.bytes().await?;
                    latencies.push(t.elapsed());
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
    all.sort();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "hunch host overhead ({} requests, {CLIENTS} concurrent clients, 3 questions each, instant reader, {cores} cores, {} build, clients on the same machine):",
        all.len(),
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
    println!(
        "  p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms",
        percentile(&all, 0.5).as_secs_f64() * 1e3,
        percentile(&all, 0.99).as_secs_f64() * 1e3,
        all[all.len() - 1].as_secs_f64() * 1e3
    );
    println!("  {:.0} requests/s", all.len() as f64 / wall.as_secs_f64());
    Ok(())
}
