//! Part 1: throughput with batching off and on.

use crate::args::Args;
use crate::sidecar::{fmt_opt, http_client, post_read, start_sidecar, MemoryUse};
use hunch_core::ReadStats;
use hunch_e2e::bench::{median, percentile, read_request};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

pub(crate) fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

pub(crate) struct ThroughputRun {
    pub(crate) blas: Vec<String>,
    pub(crate) reads: usize,
    pub(crate) elapsed: f64,
    pub(crate) latencies: Vec<f64>,
    pub(crate) stats: Vec<ReadStats>,
    /// State index → the distributions answered for it.
    pub(crate) answers: HashMap<usize, Vec<Vec<f64>>>,
    pub(crate) memory: MemoryUse,
}

impl ThroughputRun {
    pub(crate) fn reads_per_second(&self) -> f64 {
        self.reads as f64 / self.elapsed
    }
}

pub(crate) async fn throughput_run(
    args: &Args,
    accelerator: &Path,
    dir: &Path,
    batching: bool,
) -> Result<ThroughputRun, String> {
    let label = if batching { "on" } else { "off" };
    let sidecar = start_sidecar(
        accelerator,
        dir,
        &args.dtype,
        &[
            "--batching",
            label,
            "--prefix-cache-mb",
            "0",
            "--queue",
            &(args.clients * 2 + 8).to_string(),
        ],
    )
    .await?;
    sidecar.describe(&format!("batching {label}, prefix cache off"));
    let url = sidecar.url.clone();

    // Warm-up: one read per client, all at once, not counted.
    let t = Instant::now();
    let warm: Vec<_> = (0..args.clients)
        .map(|c| {
            let url = url.clone();
            tokio::spawn(async move {
                let client = http_client()?;
                post_read(&client, &url, &read_request(9_000_000 + c, None)).await
            })
        })
        .collect();
    for w in warm {
        w.await.map_err(|e| e.to_string())??;
    }
    eprintln!(
        "  [{label}] warm-up: {} reads in {:.1} s",
        args.clients,
        t.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    let stop = started + Duration::from_secs_f64(args.seconds);
    let tasks: Vec<_> = (0..args.clients)
        .map(|c| {
            let url = url.clone();
            let label = label.to_string();
            tokio::spawn(async move {
                let client = http_client()?;
                let mut done = Vec::new();
                let mut k = 0usize;
                while Instant::now() < stop {
                    let index = c * 100_000 + k;
                    let (outcome, wall) =
                        post_read(&client, &url, &read_request(index, None)).await?;
                    eprintln!(
                        "  [{label}] client {c} read {k}: {:.0} ms, batched with up to {} requests",
                        1e3 * wall,
                        outcome.stats.max_batch_requests
                    );
                    done.push((index, outcome, wall));
                    k += 1;
                }
                Ok::<_, String>(done)
            })
        })
        .collect();
    let mut run = ThroughputRun {
        blas: sidecar.blas.clone(),
        reads: 0,
        elapsed: 0.0,
        latencies: Vec::new(),
        stats: Vec::new(),
        answers: HashMap::new(),
        memory: MemoryUse::default(),
    };
    for t in tasks {
        for (index, outcome, wall) in t.await.map_err(|e| e.to_string())?? {
            run.reads += 1;
            run.latencies.push(wall);
            run.answers.insert(
                index,
                outcome.distributions.iter().map(|d| d.0.clone()).collect(),
            );
            run.stats.push(outcome.stats);
        }
    }
    run.elapsed = started.elapsed().as_secs_f64();
    run.memory = sidecar.stop();
    Ok(run)
}

pub(crate) fn print_throughput_row(label: &str, run: &ThroughputRun) {
    let f = |g: &dyn Fn(&ReadStats) -> f64| mean(&run.stats.iter().map(g).collect::<Vec<_>>());
    println!(
        "{:<10} {:>6} {:>8.1} {:>8.3} {:>9.0} ms {:>9.0} ms {:>10.2} {:>8} {:>7.2} {:>9}",
        label,
        run.reads,
        run.elapsed,
        run.reads_per_second(),
        1e3 * median(run.latencies.clone()),
        1e3 * percentile(run.latencies.clone(), 0.95),
        f(&|s| s.max_batch_requests as f64),
        run.stats
            .iter()
            .map(|s| s.max_batch_rows)
            .max()
            .unwrap_or(0),
        f(&|s| s.draws as f64),
        fmt_opt(run.memory.peak_mb, "MB"),
    );
}

/// Compares the answers of the states both runs read: (common, identical, largest |Δp|).
pub(crate) fn compare_answers(
    a: &HashMap<usize, Vec<Vec<f64>>>,
    b: &HashMap<usize, Vec<Vec<f64>>>,
) -> (usize, usize, f64) {
    let mut common = 0;
    let mut identical = 0;
    let mut largest = 0.0f64;
    for (index, da) in a {
        let Some(db) = b.get(index) else { continue };
        common += 1;
        let same_shape = da.len() == db.len() && da.iter().zip(db).all(|(x, y)| x.len() == y.len());
        if !same_shape {
            largest = f64::INFINITY;
            continue;
        }
        let mut bits_equal = true;
        for (x, y) in da.iter().zip(db) {
            for (p, q) in x.iter().zip(y) {
                bits_equal &= p.to_bits() == q.to_bits();
                largest = largest.max((p - q).abs());
            }
        }
        identical += usize::from(bits_equal);
    }
    (common, identical, largest)
}

pub(crate) struct ThroughputSummary {
    pub(crate) blas: Vec<String>,
    pub(crate) speedup: f64,
    pub(crate) identical: String,
    pub(crate) deviation: Option<f64>,
    pub(crate) memory_off: MemoryUse,
    pub(crate) memory_on: MemoryUse,
}

pub(crate) async fn throughput_part(
    args: &Args,
    accelerator: &Path,
    dir: &Path,
) -> Result<ThroughputSummary, String> {
    println!(
        "\n== Throughput: {} concurrent clients, {} s each run, POST /read with 3 questions \
         (automatic draws), a new state per read, prefix cache off ==",
        args.clients, args.seconds
    );
    let off = throughput_run(args, accelerator, dir, false).await?;
    let on = throughput_run(args, accelerator, dir, true).await?;
    println!(
        "\n{:<10} {:>6} {:>8} {:>8} {:>12} {:>12} {:>10} {:>8} {:>7} {:>9}",
        "batching",
        "reads",
        "wall s",
        "reads/s",
        "p50",
        "p95",
        "mean batch",
        "max rows",
        "draws",
        "peak RSS"
    );
    print_throughput_row("off", &off);
    print_throughput_row("on", &on);
    println!(
        "(wall: from the first counted request to the last answer, so the reads in flight when the \
         {} s ran out are counted and timed; mean batch: mean over reads of max_batch_requests)",
        args.seconds
    );
    let speedup = on.reads_per_second() / off.reads_per_second();
    println!("batching speed-up (on/off): {speedup:.2}x");
    let (common, identical, largest) = compare_answers(&off.answers, &on.answers);
    let verdict = if common > 0 && identical == common {
        "yes"
    } else {
        "no"
    };
    println!(
        "answers identical on {common} common requests: {verdict} ({identical} bit-identical, \
         largest |Δp| {largest:.3e})"
    );
    let deviation = on.stats.iter().find_map(|s| s.batch_deviation);
    println!(
        "batch deviation reported with batched answers (the start-up probe): {}",
        deviation
            .map(|d| format!("{d:.3e}"))
            .unwrap_or_else(|| "none (no answer shared a forward)".into())
    );
    Ok(ThroughputSummary {
        blas: on.blas,
        speedup,
        identical: format!("{verdict} ({identical}/{common})"),
        deviation,
        memory_off: off.memory,
        memory_on: on.memory,
    })
}
