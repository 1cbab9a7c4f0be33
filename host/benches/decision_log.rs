//! What decision records cost a policy request over HTTP: latency and throughput with the
//! decision log off, writing to a file, and writing to a file with a shadow candidate, measured
//! in one run against one in-process server setup, printed as ratios to "off". Reads come from a
//! reader that answers at once, so what is measured is the host, not a model.
//!
//!     cargo bench -p hunch --bench decision_log                 # release, the real numbers
//!     cargo bench -p hunch --bench decision_log --profile dev   # quick, reuses the test build
//!
//! Not a test: it prints numbers and asserts nothing.

use hunch::decision::settings::DecisionLogSettings;
use std::path::Path;
use std::time::Instant;

mod common;
use common::{closed_loop, percentile, post_probe, probe_dirs, samples_from_env, PolicyServer};

struct Figures {
    p50_ms: f64,
    p99_ms: f64,
    per_second: f64,
}

/// Serves the policy directory with `log` and measures `n` sequential requests, then `n` over
/// 8 concurrent clients.
async fn measure(
    dir: &Path,
    log: DecisionLogSettings,
    n: usize,
) -> Result<Figures, Box<dyn std::error::Error>> {
    let served = PolicyServer::start(dir, log).await?;
    let url = served.url.clone();
    let client = reqwest::Client::new();
    for _ in 0..200 {
        post_probe(&client, &url).await?;
    }
    let mut latencies = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        post_probe(&client, &url).await?;
        latencies.push(t.elapsed().as_secs_f64() * 1e3);
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let per_second = closed_loop(&url, n, 8).await?;
    served.stop().await;
    Ok(Figures {
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        per_second,
    })
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = samples_from_env();
    let dirs = probe_dirs()?;
    let (plain, shadowed) = (&dirs.plain, &dirs.shadowed);
    let to_file = |name: &str| dirs.log_file(name);

    let off = measure(plain.path(), DecisionLogSettings::default(), n).await?;
    let file = measure(plain.path(), to_file("file.ndjson"), n).await?;
    let shadow = measure(shadowed.path(), to_file("shadow.ndjson"), n).await?;
    let bytes = std::fs::metadata(dirs.logs.path().join("file.ndjson"))?.len();
    println!(
        "policy request over HTTP (one read of 2 questions, instant reader), {n} requests each, {} CPUs",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    println!(
        "{:<26} {:>9} {:>9} {:>10}   {:>10} {:>10} {:>10}",
        "", "p50 ms", "p99 ms", "req/s (8)", "p50 ratio", "p99 ratio", "req/s ratio"
    );
    for (label, f) in [
        ("decision log off", &off),
        ("log to a file", &file),
        ("file + shadow candidate", &shadow),
    ] {
        println!(
            "{label:<26} {:>9.3} {:>9.3} {:>10.0}   {:>10.2} {:>10.2} {:>10.2}",
            f.p50_ms,
            f.p99_ms,
            f.per_second,
            f.p50_ms / off.p50_ms,
            f.p99_ms / off.p99_ms,
            f.per_second / off.per_second
        );
    }
    println!(
        "event size: {:.0} bytes/decision",
        bytes as f64 / (200 + n + n / 8 * 8) as f64
    );
    Ok(())
}
