//! Benchmark of model switching under one memory budget (docs/models.md; not a test: it prints
//! figures and asserts nothing about timing).
//!
//! ```text
//! cargo build --release -p hunch -p hunch-accelerator -p hunch-e2e --bin thrash-bench
//! target/release/thrash-bench [--a FILE] [--b FILE] [--switches 10]
//! target/release/thrash-bench --during-load [--reads 200]
//! ```
//!
//! Two models (default: the tiny llama and qwen3 GGUFs of the accelerator's tests) in a models
//! directory, requested in turn, `--switches` times each way, on two servers started the same
//! way but for the budget:
//!
//! 1. **both fit** (the baseline, measured in the same run): every request finds its model loaded;
//! 2. **one fits** (the thrash): every request evicts the other model and loads its own.
//!
//! Prints the median request latency of each, the per-switch cost (thrash less baseline) and,
//! beside it, the median load time the server measured (`hunch_model_load_seconds`), so the
//! switch's cost can be read as "load time plus what": the eviction (ending a process) and the
//! bookkeeping.
//!
//! `--during-load` measures something else: whether one model's load slows another's reads. On
//! one server where both fit, `--reads` reads of the loaded model `a` with nothing else going on,
//! then as many while `b` loads again and again (`POST /v1/models/b/load`, `…/unload`, in a
//! loop); it prints the median and 90th percentile of each, their ratio, and the share of the
//! second phase during which a load of `b` was under way.

use hunch_e2e::bench::{build_kind, cores, exit_code, load_average, median, percentile, Flags};
use hunch_e2e::{accelerator_bin, start_hunch_with, target_dir, wait_ready, workspace_root, Hunch};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The admin key of the `--during-load` server (it loads and unloads `b` by hand).
const ADMIN: &str = "thrash-bench";

struct Options {
    a: PathBuf,
    b: PathBuf,
    switches: usize,
    during_load: bool,
    reads: usize,
}

fn options() -> Result<Options, String> {
    let data = workspace_root().join("accelerator/tests/data/causal");
    let mut o = Options {
        a: data.join("tiny-llama.q8_0.gguf"),
        b: data.join("tiny-qwen3.q8_0.gguf"),
        switches: 10,
        during_load: false,
        reads: 200,
    };
    let mut flags = Flags::from_env();
    while let Some(flag) = flags.next_flag() {
        match flag.as_str() {
            "--a" => o.a = flags.value(&flag)?.into(),
            "--b" => o.b = flags.value(&flag)?.into(),
            "--switches" => o.switches = flags.parsed(&flag)?,
            "--during-load" => o.during_load = true,
            "--reads" => o.reads = flags.parsed(&flag)?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

fn request(model: &str) -> Value {
    json!({"model": model, "state": "I was charged twice this month.",
           "questions": {"billing": {"type": "noul", "instructions": "Is this about billing?"}}})
}

async fn start(dir: &std::path::Path, budget: u64, extra: &[&str]) -> Result<Hunch, String> {
    let d = dir.to_string_lossy().into_owned();
    let budget = budget.to_string();
    let bin = accelerator_bin().to_string_lossy().into_owned();
    let mut args = vec![
        "--models-dir",
        d.as_str(),
        "--memory-budget",
        budget.as_str(),
        "--request-timeout",
        "600",
    ];
    args.extend_from_slice(extra);
    let hunch = start_hunch_with(&args, &[("HUNCH_ACCELERATOR_BIN", bin)]);
    wait_ready(&hunch.url, Duration::from_secs(60)).await;
    Ok(hunch)
}

/// One request's seconds, which must be answered.
async fn timed(http: &reqwest::Client, url: &str, model: &str) -> Result<f64, String> {
    let started = Instant::now();
    let r = http
        .post(format!("{url}/v1/systemone"))
        .json(&request(model))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    let text = r.text().await.unwrap_or_default();
    if !status.is_success() {
        return Err(format!("{model}: {status} {text}"));
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The sum of the `/metrics` lines starting with `name`.
async fn metric_sum(url: &str, name: &str) -> f64 {
    let text = match reqwest::get(format!("{url}/metrics")).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Requests `a`, `b`, `a`, `b`… (after one of each to load them): every latency.
async fn alternate(url: &str, switches: usize) -> Result<Vec<f64>, String> {
    let http = reqwest::Client::new();
    timed(&http, url, "a").await?;
    timed(&http, url, "b").await?;
    let mut seconds = Vec::new();
    for _ in 0..switches {
        seconds.push(timed(&http, url, "a").await?);
        seconds.push(timed(&http, url, "b").await?);
    }
    Ok(seconds)
}

async fn run() -> Result<(), String> {
    let o = options()?;
    let dir = target_dir().join("bench-thrash-models");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (name, from) in [("a", &o.a), ("b", &o.b)] {
        std::fs::copy(from, dir.join(format!("{name}.gguf")))
            .map_err(|e| format!("{}: {e}", from.display()))?;
    }
    if o.during_load {
        return during_load(&o, &dir).await;
    }
    println!(
        "thrash-bench: {} and {}, {} switches each way; {} build, {} cores, load {}",
        o.a.display(),
        o.b.display(),
        o.switches,
        build_kind(),
        cores(),
        load_average()
    );

    // Both fit: a budget far above two sidecars.
    let roomy = start(&dir, 64 << 30, &[]).await?;
    let baseline = alternate(&roomy.url, o.switches).await?;
    // What one sidecar holds once it has read: the thrash budget fits one and a half.
    let list: Value = reqwest::get(format!("{}/v1/models", roomy.url))
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    let resident: Vec<u64> = list["models"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|e| e["x_resident_bytes"].as_u64())
                .collect()
        })
        .unwrap_or_default();
    let unit = resident.iter().copied().max().ok_or("no model resident")?;
    drop(roomy);

    let tight = start(&dir, unit * 3 / 2, &[]).await?;
    let thrash = alternate(&tight.url, o.switches).await?;
    let loads = metric_sum(&tight.url, "hunch_model_load_seconds_count").await;
    let load_seconds = metric_sum(&tight.url, "hunch_model_load_seconds_sum").await;
    let evictions = metric_sum(&tight.url, "hunch_model_evictions_total{reason=\"budget\"}").await;

    let base = median(baseline);
    let switch = median(thrash);
    let load = if loads > 0.0 {
        load_seconds / loads
    } else {
        0.0
    };
    println!(
        "sidecar resident after a read: {:.1} MiB; thrash budget {:.1} MiB",
        unit as f64 / 1048576.0,
        (unit * 3 / 2) as f64 / 1048576.0
    );
    println!("| | median request | ratio to loaded |");
    println!("|---|---|---|");
    println!(
        "| both loaded (baseline) | {:.1} ms | 1.0× |",
        base * 1000.0
    );
    println!(
        "| every request switches | {:.1} ms | {:.1}× |",
        switch * 1000.0,
        switch / base
    );
    println!(
        "per switch: {:.1} ms over the baseline; mean load time (hunch_model_load_seconds) {:.1} ms over {loads} loads; {evictions} evictions",
        (switch - base) * 1000.0,
        load * 1000.0
    );
    Ok(())
}

/// `n` reads of `model` in a row: each one's seconds.
async fn reads(
    http: &reqwest::Client,
    url: &str,
    model: &str,
    n: usize,
) -> Result<Vec<f64>, String> {
    let mut seconds = Vec::with_capacity(n);
    for _ in 0..n {
        seconds.push(timed(http, url, model).await?);
    }
    Ok(seconds)
}

/// An admin action on `b` (`load` answers once loaded; `unload` at once).
async fn admin(http: &reqwest::Client, url: &str, action: &str) -> Result<(), String> {
    let r = http
        .post(format!("{url}/v1/models/b/{action}"))
        .header("x-admin-key", ADMIN)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        return Err(format!("{action} b: {}", r.status()));
    }
    Ok(())
}

/// Whether `b` is `available` again after an unload (its process has ended).
async fn b_is_available(http: &reqwest::Client, url: &str) -> bool {
    let Ok(r) = http.get(format!("{url}/v1/models")).send().await else {
        return false;
    };
    let list: Value = r.json().await.unwrap_or_default();
    list["models"]
        .as_array()
        .and_then(|m| m.iter().find(|e| e["name"] == "b"))
        .is_some_and(|b| b["x_state"] == "available")
}

/// Reads of `a` alone, then while `b` loads in a loop (see the module's doc).
async fn during_load(o: &Options, dir: &std::path::Path) -> Result<(), String> {
    let hunch = start(dir, 64 << 30, &["--admin-key", ADMIN]).await?;
    let http = reqwest::Client::new();
    // `a` loaded and warm, `b` loaded once (so both have run once before measuring).
    reads(&http, &hunch.url, "a", 5).await?;
    admin(&http, &hunch.url, "load").await?;
    admin(&http, &hunch.url, "unload").await?;
    let quiet = reads(&http, &hunch.url, "a", o.reads).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let loader = {
        let (stop, http, url) = (stop.clone(), http.clone(), hunch.url.clone());
        tokio::spawn(async move {
            let (mut loads, mut loading) = (0u32, 0.0f64);
            while !stop.load(Ordering::Relaxed) {
                while !b_is_available(&http, &url).await {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let started = Instant::now();
                admin(&http, &url, "load").await?;
                loading += started.elapsed().as_secs_f64();
                loads += 1;
                admin(&http, &url, "unload").await?;
            }
            Ok::<_, String>((loads, loading))
        })
    };
    // The loader's first load has started before the reads do.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let busy = reads(&http, &hunch.url, "a", o.reads).await;
    let wall = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (loads, loading) = loader.await.map_err(|e| e.to_string())??;
    let busy = busy?;
    // Quiet again, after: on a shared machine the load of others drifts, so the baseline is
    // measured on both sides of the busy phase.
    while !b_is_available(&http, &hunch.url).await {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = reads(&http, &hunch.url, "a", o.reads).await?;

    println!(
        "thrash-bench --during-load: reads of {} while {} loads; {} build, {} cores, load {}",
        o.a.display(),
        o.b.display(),
        build_kind(),
        cores(),
        load_average()
    );
    let row = |label: &str, v: &[f64]| {
        (
            label.to_string(),
            median(v.to_vec()) * 1000.0,
            percentile(v.to_vec(), 0.9) * 1000.0,
        )
    };
    let both: Vec<f64> = quiet.iter().chain(&after).copied().collect();
    let (q, b) = (
        row("nothing else (before and after)", &both),
        row("while b loads", &busy),
    );
    println!("| reads of a ({} each phase) | median | p90 |", o.reads);
    println!("|---|---|---|");
    for (label, median, p90) in [
        &row("nothing else, before", &quiet),
        &b,
        &row("nothing else, after", &after),
    ] {
        println!("| {label} | {median:.1} ms | {p90:.1} ms |");
    }
    println!(
        "ratio (while b loads / nothing else, both sides): median {:.2}×, p90 {:.2}×; {loads} loads of b, \
         under way {:.0}% of the {:.1} s the reads took",
        b.1 / q.1,
        b.2 / q.2,
        (loading / wall * 100.0).min(100.0),
        wall
    );
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    exit_code("thrash-bench", run().await)
}
