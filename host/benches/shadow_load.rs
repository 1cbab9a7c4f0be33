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

use std::time::{Duration, Instant};

mod common;
use common::{closed_loop, percentile, post_probe, probe_dirs, samples_from_env, PolicyServer};

/// Latencies (ms, ascending) of `n` requests started every `1/rate` seconds.
async fn open_loop(url: &str, rate: f64, n: usize) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let client = reqwest::Client::new();
    for _ in 0..100 {
        post_probe(&client, url).await?;
    }
    let period = Duration::from_secs_f64(1.0 / rate);
    let start = tokio::time::Instant::now();
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        tokio::time::sleep_until(start + period * i as u32).await;
        let (client, url) = (client.clone(), url.to_string());
        handles.push(tokio::spawn(async move {
            let t = Instant::now();
            post_probe(&client, &url)
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

/// Shadow runs counted so far by the server behind `url`: (ran, skipped).
async fn shadow_counts(url: &str) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    let base = url.trim_end_matches("/v1/policies/probe");
    let text = reqwest::get(format!("{base}/metrics"))
        .await?
        .text()
        .await?;
    let sum = |prefix: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    Ok((
        sum("hunch_policy_shadow_total{"),
        sum("hunch_policy_shadow_skipped_total{"),
    ))
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
    let dirs = probe_dirs()?;
    let (plain, shadowed) = (&dirs.plain, &dirs.shadowed);
    let to_file = |name: &str| dirs.log_file(name);

    let served = PolicyServer::start(plain.path(), to_file("capacity.ndjson")).await?;
    let warm = reqwest::Client::new();
    for _ in 0..200 {
        post_probe(&warm, &served.url).await?;
    }
    let max = closed_loop(&served.url, n, 8).await?;
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
        let (ran, skipped) = shadow_counts(&with.url).await?;
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
        println!("{round:<7} shadow runs: {ran} ran, {skipped} skipped (no free shadow slot)");
    }
    Ok(())
}
