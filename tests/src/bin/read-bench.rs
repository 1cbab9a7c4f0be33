//! Benchmark of real reads (not a test): the real `hunch-accelerator` sidecar on a random
//! checkpoint of a few hundred MB, then the whole stack (`hunch serve` supervising it) under N
//! concurrent clients.
//!
//! ```text
//! cargo build --release -p hunch-accelerator -p hunch-e2e
//! target/release/read-bench [--preset small|mid] [--ckpt DIR] [--reps 5] [--clients 1,4]
//!                           [--seconds 20] [--dtype float32|bfloat16]
//! ```
//!
//! Part 1 posts `ReadRequest`s straight to the sidecar's `POST /read` and prints the engine's own
//! `ReadStats` split (tokenize / prefill / denoise) for 1 and 4 draws. Every read gets a state that
//! differs from its first character on, so the prefix cache cannot skip the prefill (the reused
//! tokens are printed to show it). Part 2 starts `hunch serve --model bench=DIR` and measures
//! requests/s and latency through HTTP, validation, the queue and the sidecar with N clients.
//! It prints the machine's core count and the BLAS libraries the sidecar process has mapped.

use hunch_core::ReadOutcome;
use hunch_e2e::bench::{median, percentile, read_request, Flags};
use hunch_e2e::{ensure_random_checkpoint, start_process, target_dir, wait_ready};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

struct Args {
    preset: String,
    ckpt: Option<PathBuf>,
    reps: usize,
    clients: Vec<usize>,
    seconds: f64,
    dtype: String,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        preset: "mid".into(),
        ckpt: None,
        reps: 5,
        clients: vec![1, 4],
        seconds: 20.0,
        dtype: "float32".into(),
    };
    let mut flags = Flags::from_env();
    while let Some(flag) = flags.next_flag() {
        match flag.as_str() {
            "--preset" => a.preset = flags.value(&flag)?,
            "--ckpt" => a.ckpt = Some(PathBuf::from(flags.value(&flag)?)),
            "--reps" => a.reps = flags.parsed(&flag)?,
            "--seconds" => a.seconds = flags.parsed(&flag)?,
            "--dtype" => a.dtype = flags.value(&flag)?,
            "--clients" => {
                a.clients = flags
                    .value(&flag)?
                    .split(',')
                    .map(|c| c.trim().parse().map_err(|e| format!("--clients: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "-h" | "--help" => {
                println!(
                    "read-bench [--preset small|mid] [--ckpt DIR] [--reps N] [--clients 1,4] \
                     [--seconds S] [--dtype float32|bfloat16]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.reps == 0 || a.clients.is_empty() {
        return Err("--reps and --clients must be positive".into());
    }
    Ok(a)
}

async fn sidecar_part(
    args: &Args,
    dir: &std::path::Path,
    accelerator: &PathBuf,
) -> Result<(), String> {
    let started = Instant::now();
    let ready = hunch_e2e::bench::start_ready_sidecar(
        accelerator,
        &[
            "serve".into(),
            "--model".into(),
            dir.display().to_string(),
            "--dtype".into(),
            args.dtype.clone(),
            // Reads report the MLX operations their passes built (a graph walk per step).
            "--count-ops".into(),
        ],
        Duration::from_secs(1200),
    )
    .await?;
    let (url, sidecar) = (ready.url, ready.process);
    let client = reqwest::Client::new();
    println!(
        "sidecar load: {:.2} s; BLAS mapped by the sidecar (pid {}): {:?}",
        started.elapsed().as_secs_f64(),
        sidecar.pid(),
        ready.blas_libraries
    );
    println!(
        "\n{:<7} {:>5} {:>7} {:>8} {:>11} {:>10} {:>11} {:>9} {:>7} {:>6} {:>6} {:>8}",
        "draws",
        "reads",
        "prompt",
        "reused",
        "tokenize",
        "prefill",
        "denoise",
        "wall",
        "draws",
        "evals",
        "passes",
        "ops/pass"
    );
    let mut n = 0usize;
    for draws in [1u32, 4] {
        // One warm-up read (MLX compiles and allocates on first use).
        let mut samples = Vec::new();
        for rep in 0..=args.reps {
            n += 1;
            let t = Instant::now();
            let r = client
                .post(format!("{url}/read"))
                .json(&read_request(n, Some(draws)))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !r.status().is_success() {
                return Err(format!(
                    "read: {} {}",
                    r.status(),
                    r.text().await.unwrap_or_default()
                ));
            }
            let outcome: ReadOutcome = r.json().await.map_err(|e| e.to_string())?;
            let wall = t.elapsed().as_secs_f64();
            // Each read as it lands: on a slow machine the partial output is still a result.
            let s = &outcome.stats;
            eprintln!(
                "  read {n}: draws {} prompt {} reused {} tokenize {:.1} ms prefill {:.1} ms \
                 denoise {:.1} ms wall {:.1} ms evals {} passes {} ops {}{}",
                s.draws,
                s.prompt_tokens,
                s.reused_tokens,
                1e3 * s.tokenize_seconds,
                1e3 * s.prefill_seconds,
                1e3 * s.denoise_seconds,
                1e3 * wall,
                s.evaluations,
                s.forwards,
                s.operations,
                if rep == 0 { " (warm-up)" } else { "" }
            );
            if rep > 0 {
                samples.push((outcome.stats, wall));
            }
        }
        let med = |f: &dyn Fn(&hunch_core::ReadStats) -> f64| {
            median(samples.iter().map(|(s, _)| f(s)).collect())
        };
        println!(
            "{:<7} {:>5} {:>7} {:>8} {:>8.1} ms {:>7.1} ms {:>8.1} ms {:>6.1} ms {:>7} {:>6} {:>6} {:>8.0}",
            draws,
            samples.len(),
            med(&|s| s.prompt_tokens as f64),
            med(&|s| s.reused_tokens as f64),
            1e3 * med(&|s| s.tokenize_seconds),
            1e3 * med(&|s| s.prefill_seconds),
            1e3 * med(&|s| s.denoise_seconds),
            1e3 * median(samples.iter().map(|(_, w)| *w).collect()),
            med(&|s| s.draws as f64),
            med(&|s| s.evaluations as f64),
            med(&|s| s.forwards as f64),
            med(&|s| s.operations as f64 / s.forwards.max(1) as f64),
        );
    }
    println!(
        "(medians over {} reads after one warm-up; wall = HTTP round trip to the sidecar; evals = \
         blocking evaluations per read (device waits), passes = forward passes per read, ops/pass \
         = MLX operations built per forward pass)",
        args.reps
    );
    drop(sidecar);
    Ok(())
}

async fn stack_part(
    args: &Args,
    dir: &std::path::Path,
    accelerator: &std::path::Path,
) -> Result<(), String> {
    let hunch = ["hunch", "hunch-e2e-server"]
        .iter()
        .map(|b| target_dir().join(b))
        .find(|p| p.exists())
        .ok_or("no hunch binary next to read-bench: build -p hunch or -p hunch-e2e")?;
    let max_clients = args.clients.iter().copied().max().unwrap_or(1);
    let (url, server) = start_process(
        &hunch,
        &[
            "serve".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--model".into(),
            format!("bench={}", dir.display()),
            "--accelerator-bin".into(),
            accelerator.display().to_string(),
            format!("--sidecar-arg=--dtype={}", args.dtype),
            "--max-concurrent-reads".into(),
            max_clients.to_string(),
            "--request-timeout".into(),
            "600".into(),
        ],
        &[],
        "HUNCH_LISTENING ",
    );
    wait_ready(&url, Duration::from_secs(600)).await;
    println!(
        "\nwhole stack: {} (pid {}) supervising the sidecar, POST /v1/systemone, 3 questions, \
         automatic draws",
        hunch.display(),
        server.pid()
    );
    println!(
        "{:<8} {:>9} {:>10} {:>10} {:>10}",
        "clients", "requests", "req/s", "p50", "p99"
    );
    let body = |n: usize| {
        let mut r = hunch_e2e::sample_request();
        r["state"] = json!(format!(
            "Ticket #{n}: {}",
            r["state"].as_str().unwrap_or("")
        ));
        r
    };
    // Warm-up.
    let warm = reqwest::Client::new()
        .post(format!("{url}/v1/systemone"))
        .json(&body(0))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !warm.status().is_success() {
        return Err(format!(
            "warm-up: {}",
            warm.text().await.unwrap_or_default()
        ));
    }
    let mut next = 1usize;
    for &clients in &args.clients {
        let stop = Instant::now() + Duration::from_secs_f64(args.seconds);
        let started = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let url = url.clone();
                let base = next + c * 1_000_000;
                tokio::spawn(async move {
                    let client = reqwest::Client::new();
                    let mut latencies = Vec::new();
                    let mut i = 0;
                    while Instant::now() < stop {
                        let t = Instant::now();
                        let r = client
                            .post(format!("{url}/v1/systemone"))
                            .json(&body(base + i))
                            .send()
                            .await
                            .map_err(|e| e.to_string())?;
                        if !r.status().is_success() {
                            return Err(format!(
                                "{} {}",
                                r.status(),
                                r.text().await.unwrap_or_default()
                            ));
                        }
                        let _ = r.bytes().await;
                        latencies.push(t.elapsed().as_secs_f64());
                        eprintln!(
                            "  client {c}: request {i} in {:.0} ms",
                            1e3 * t.elapsed().as_secs_f64()
                        );
                        i += 1;
                    }
                    Ok::<_, String>(latencies)
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.map_err(|e| e.to_string())??);
        }
        next += clients * 1_000_000 + 1;
        let elapsed = started.elapsed().as_secs_f64();
        println!(
            "{:<8} {:>9} {:>10.2} {:>7.0} ms {:>7.0} ms",
            clients,
            all.len(),
            all.len() as f64 / elapsed,
            1e3 * median(all.clone()),
            1e3 * percentile(all, 0.99)
        );
    }
    drop(server);
    Ok(())
}

async fn run() -> Result<(), String> {
    let args = parse_args()?;
    let cores = hunch_e2e::bench::cores();
    println!(
        "read-bench: {cores} cores available, load average {}, binaries in {} ({} build)",
        hunch_e2e::bench::load_average(),
        target_dir().display(),
        hunch_e2e::bench::build_kind()
    );
    let accelerator = hunch_e2e::accelerator_bin();
    let dir = match &args.ckpt {
        Some(dir) => dir.clone(),
        None => {
            let dir = target_dir()
                .join("bench-checkpoints")
                .join(format!("{}-seed0", args.preset));
            let t = Instant::now();
            ensure_random_checkpoint(&dir, &args.preset, 0, &[]);
            println!(
                "checkpoint: {} (ready in {:.1} s)",
                dir.display(),
                t.elapsed().as_secs_f64()
            );
            dir
        }
    };
    let bytes = hunch_e2e::bench::dir_bytes(&dir)?;
    println!(
        "checkpoint {} ({:.0} MB on disk), dtype {}",
        dir.display(),
        bytes as f64 / 1e6,
        args.dtype
    );
    sidecar_part(&args, &dir, &accelerator).await?;
    stack_part(&args, &dir, &accelerator).await
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    hunch_e2e::bench::exit_code("read-bench", run().await)
}
