//! Whether a shadow candidate slows live decisions: live latency at the same offered load with
//! and without a candidate shadowing every request, in one run, printed as ratios.
//!
//! The load is open-loop (requests start on a fixed schedule whatever the server does, as real
//! clients do), at a fraction of the throughput this machine reaches with no candidate
//! (`SHADOW_LOAD`, default 0.5). The two configurations alternate over `SHADOW_ROUNDS` rounds
//! (default 3) so that drift of a shared machine hits both alike. Reads come from a reader that
//! answers at once, so what is measured is the host: the candidate's guest code, its event, and
//! the active decision's.
//!
//!     cargo bench -p hunch --bench shadow_load                 # release, the real numbers
//!     cargo bench -p hunch --bench shadow_load --profile dev   # quick, reuses the test build
//!
//! Not a test: it prints numbers and asserts nothing.

use hunch::decision::settings::DecisionLogSettings;
use hunch::policy::testing::{built_policy, with_marker};
use serde_json::json;
use std::time::{Duration, Instant};

mod common;
use common::{percentile, samples_from_env, PolicyServer};

fn body() -> serde_json::Value {
    json!({"id": 1, "message": "The production database is down."})
}

async fn call(client: &reqwest::Client, url: &str) -> Result<(), reqwest::Error> {
    let r = client.post(url).json(&body()).send().await?;
    assert!(r.status().is_success(), "{}", r.status());
    r.bytes().await.map(|_| ())
}

/// Requests per second 8 closed-loop clients get with no candidate.
async fn capacity(url: &str, n: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let client = reqwest::Client::new();
    for _ in 0..200 {
        call(&client, url).await?;
    }
    let clients = 8;
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..clients {
        let (client, url) = (client.clone(), url.to_string());
        handles.push(tokio::spawn(async move {
            for _ in 0..n / clients {
                call(&client, &url).await?;
            }
            Ok::<_, reqwest::Error>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok((n / clients * clients) as f64 / started.elapsed().as_secs_f64())
}

/// Latencies (ms, ascending) of `n` requests started every `1/rate` seconds.
async fn open_loop(url: &str, rate: f64, n: usize) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let client = reqwest::Client::new();
    for _ in 0..100 {
        call(&client, url).await?;
    }
    let period = Duration::from_secs_f64(1.0 / rate);
    let start = tokio::time::Instant::now();
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        tokio::time::sleep_until(start + period * i as u32).await;
        let (client, url) = (client.clone(), url.to_string());
        handles.push(tokio::spawn(async move {
            let t = Instant::now();
            call(&client, &url)
                .await
                .map(|_| t.elapsed().as_secs_f64() * 1e3)
        }));
    }
    let mut latencies = Vec::with_capacity(n);
    for h in handles {
        latencies.push(h.await??);
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    Ok(latencies)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = samples_from_env();
    let load: f64 = env_or("SHADOW_LOAD", 0.5);
    let rounds: usize = env_or("SHADOW_ROUNDS", 3);
    let probe = built_policy("replay_probe")?;
    let plain = tempfile::tempdir()?;
    std::fs::write(plain.path().join("probe.wasm"), &probe)?;
    let shadowed = tempfile::tempdir()?;
    std::fs::write(shadowed.path().join("probe.wasm"), &probe)?;
    std::fs::write(
        shadowed.path().join("probe.candidate.wasm"),
        with_marker(probe.clone(), "candidate"),
    )?;
    std::fs::write(
        shadowed.path().join("probe.candidate.toml"),
        "[rollout]\nmode = \"shadow\"\n",
    )?;
    let logs = tempfile::tempdir()?;
    let to_file = |name: &str| DecisionLogSettings {
        path: Some(logs.path().join(name)),
        ..DecisionLogSettings::default()
    };

    let served = PolicyServer::start(plain.path(), to_file("capacity.ndjson")).await?;
    let max = capacity(&served.url, n).await?;
    served.stop().await;
    let rate = max * load;
    println!(
        "policy request over HTTP (one read of 2 questions, instant reader, decision log to a file), \
         {} CPUs; capacity without a candidate {max:.0} req/s (8 clients); open-loop load {rate:.0} req/s \
         ({load} of it), {n} requests per configuration per round",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    println!(
        "{:<7} {:<26} {:>9} {:>9} {:>9}   {:>10} {:>10}",
        "round", "", "p50 ms", "p99 ms", "max ms", "p50 ratio", "p99 ratio"
    );
    for round in 1..=rounds {
        let without =
            PolicyServer::start(plain.path(), to_file(&format!("plain-{round}.ndjson"))).await?;
        let base = open_loop(&without.url, rate, n).await?;
        without.stop().await;
        let with = PolicyServer::start(shadowed.path(), to_file(&format!("shadow-{round}.ndjson")))
            .await?;
        let shadow = open_loop(&with.url, rate, n).await?;
        with.stop().await;
        let (b50, b99) = (percentile(&base, 0.5), percentile(&base, 0.99));
        for (label, l) in [
            ("no candidate", &base),
            ("shadow on every request", &shadow),
        ] {
            let (p50, p99) = (percentile(l, 0.5), percentile(l, 0.99));
            println!(
                "{round:<7} {label:<26} {p50:>9.3} {p99:>9.3} {:>9.3}   {:>10.2} {:>10.2}",
                l.last().copied().unwrap_or(f64::NAN),
                p50 / b50,
                p99 / b99
            );
        }
    }
    Ok(())
}
