//! Benchmark of the accelerator's cross-request batching and prefix KV cache (not a test: it
//! prints figures and asserts nothing about timing).
//!
//! ```text
//! cargo build --release -p hunch-accelerator -p hunch-e2e --bin batch-bench --bin hunch-accelerator
//! target/release/batch-bench [--preset small-wide|tiny|small|mid] [--ckpt DIR] [--clients 8]
//!                            [--seconds 30] [--reps 5] [--questions 12] [--dtype float32|bfloat16]
//!                            [--only throughput|cache]
//! ```
//!
//! 1. Throughput: the real sidecar (`hunch-accelerator serve`) with `--batching off`, then a second
//!    one with `--batching on`, both with `--prefix-cache-mb 0` so only batching differs. N clients
//!    post the everyday 3-question `ReadRequest` straight to `POST /read` for `--seconds`, each
//!    with its own sequence of states (client c's k-th request reads state c·100000+k, unique from
//!    its first character), after one uncounted warm-up read per client. Prints reads/s, p50/p95
//!    latency, the mean `max_batch_requests`, the on/off speed-up, and whether the two runs gave
//!    bit-identical distributions for the states both answered.
//! 2. Prefix cache: one sidecar with default flags (cache on) and a long question list (≈1.2k
//!    system-prompt tokens, calibrated on the checkpoint's tokenizer so the whole prompt lands at
//!    1400–1700 tokens in ONE read). Cold: each sample a question list of its own (the first
//!    question starts with the sample number, so nothing past the fixed preamble every prompt
//!    starts with can be reused). Warm: the question list of an earlier cold sample with a new
//!    state. Prints median latencies, the reused tokens and the warm/cold ratio.
//! 3. Peak resident memory (`VmHWM`) of each sidecar, and its resident memory then (`VmRSS`),
//!    read just before it is stopped.
//!
//! Environment is inherited by the sidecars: run with
//! `LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0` to give MLX OpenBLAS (the BLAS the
//! sidecar mapped is printed either way).
//!
//! Modules: `args` (the command line), `requests` (what is sent), `sidecar` (the process under
//! test), `throughput` (part 1), `cache` (part 2); this file picks the checkpoint and prints the
//! summary.

mod args;
mod cache;
mod requests;
mod sidecar;
mod throughput;

use args::{parse_args, Args};
use cache::cache_part;
use hunch_e2e::{ensure_random_checkpoint, target_dir};
use sidecar::MemoryUse;
use std::path::PathBuf;
use std::time::Instant;
use throughput::throughput_part;

/// The default checkpoint: the `small` preset's compute (hidden 512, 6 layers, 4 of the experts
/// per token) with a 32k vocabulary and 96 experts per layer, so the weights are a few hundred MB
/// on disk (like a real MoE, most of them idle for any one token) while a read stays fast enough
/// for a CPU. `mid` (≈815 MB) computes ~10× more per token.
const SMALL_WIDE_SETS: &[&str] = &["vocab_size=32768", "num_experts=96"];

fn checkpoint(args: &Args) -> Result<PathBuf, String> {
    if let Some(dir) = &args.ckpt {
        return Ok(dir.clone());
    }
    let (preset, sets, name): (&str, &[&str], String) = match args.preset.as_str() {
        "small-wide" => ("small", SMALL_WIDE_SETS, "small-wide-v1-seed0".into()),
        p @ ("tiny" | "small" | "mid") => (p, &[], format!("{p}-seed0")),
        other => {
            return Err(format!(
                "unknown --preset {other} (small-wide, tiny, small, mid)"
            ))
        }
    };
    let dir = target_dir().join("bench-checkpoints").join(name);
    let t = Instant::now();
    ensure_random_checkpoint(&dir, preset, 0, sets);
    eprintln!(
        "checkpoint {} ready in {:.1} s",
        dir.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(dir)
}

async fn run() -> Result<(), String> {
    let args = parse_args()?;
    let cores = hunch_e2e::bench::cores();
    let accelerator = hunch_e2e::accelerator_bin();
    let dir = checkpoint(&args)?;
    let bytes = hunch_e2e::bench::dir_bytes(&dir)?;
    println!(
        "batch-bench: {cores} cores, load average {}, {} build; checkpoint {} ({}, {:.0} MB on \
         disk); dtype {}; LD_PRELOAD={}; OPENBLAS_NUM_THREADS={}",
        hunch_e2e::bench::load_average(),
        hunch_e2e::bench::build_kind(),
        dir.display(),
        if args.ckpt.is_some() {
            "--ckpt"
        } else {
            args.preset.as_str()
        },
        bytes as f64 / 1e6,
        args.dtype,
        std::env::var("LD_PRELOAD").unwrap_or_else(|_| "(unset)".into()),
        std::env::var("OPENBLAS_NUM_THREADS").unwrap_or_else(|_| "(unset)".into()),
    );
    println!(
        "sidecar: {} (BLAS as mapped by each sidecar below)",
        accelerator.display()
    );

    let throughput = match args.only.as_deref() {
        None | Some("throughput") => Some(throughput_part(&args, &accelerator, &dir).await?),
        _ => None,
    };
    let cache = match args.only.as_deref() {
        None | Some("cache") => Some(cache_part(&args, &accelerator, &dir).await?),
        _ => None,
    };

    println!("\n== Summary ==");
    let blas = throughput
        .as_ref()
        .map(|t| &t.blas)
        .or(cache.as_ref().map(|c| &c.blas))
        .cloned()
        .unwrap_or_default();
    println!("BLAS mapped by the sidecars: {blas:?}");
    if let Some(t) = &throughput {
        println!("batching speed-up (on/off): {:.2}x", t.speedup);
        println!("answers identical (off vs on): {}", t.identical);
        println!(
            "batch deviation (probe): {}",
            t.deviation
                .map(|d| format!("{d:.3e}"))
                .unwrap_or_else(|| "not reported".into())
        );
    }
    if let Some(c) = &cache {
        println!(
            "prefix cache: prompt {} tokens, cold {:.0} ms, warm {:.0} ms ({:.0} tokens reused), \
             warm/cold {:.2}",
            c.prompt_tokens, c.cold_ms, c.warm_ms, c.reused, c.ratio
        );
    }
    let none = MemoryUse::default();
    println!("peak RSS (VmHWM) of each sidecar, read just before stopping it:");
    for (label, memory) in [
        (
            "batching off",
            throughput.as_ref().map_or(none, |t| t.memory_off),
        ),
        (
            "batching on",
            throughput.as_ref().map_or(none, |t| t.memory_on),
        ),
        ("prefix cache", cache.as_ref().map_or(none, |c| c.memory)),
    ] {
        println!("  {label:<13} {}", memory.show());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    hunch_e2e::bench::exit_code("batch-bench", run().await)
}
