//! Part 2: the prefix cache, cold against warm, on a ~1.5k-token prompt.

use crate::args::Args;
use crate::requests::long_request;
use crate::sidecar::{http_client, post_read, start_sidecar, MemoryUse};
use hunch_core::ReadStats;
use hunch_e2e::bench::median;
use std::path::Path;

pub(crate) const PROMPT_MIN: u64 = 1400;
pub(crate) const PROMPT_MAX: u64 = 1700;
pub(crate) const PROMPT_TARGET: f64 = 1550.0;

pub(crate) struct CacheSummary {
    pub(crate) blas: Vec<String>,
    pub(crate) prompt_tokens: u64,
    pub(crate) cold_ms: f64,
    pub(crate) warm_ms: f64,
    pub(crate) reused: f64,
    pub(crate) ratio: f64,
    pub(crate) memory: MemoryUse,
}

pub(crate) async fn cache_part(
    args: &Args,
    accelerator: &Path,
    dir: &Path,
) -> Result<CacheSummary, String> {
    println!(
        "\n== Prefix cache: one client, default sidecar flags (cache on), {} questions in one \
         read, ~1.5k-token prompts ==",
        args.questions
    );
    let sidecar = start_sidecar(accelerator, dir, &args.dtype, &[]).await?;
    sidecar.describe("defaults, prefix cache on");
    let url = sidecar.url.clone();
    let client = http_client()?;

    // Calibrate the text length on this tokenizer (the calibration reads are also the warm-up;
    // each has its own question list, so nothing they cache is reused later).
    let mut scale = 1.0f64;
    let mut points: Vec<(f64, f64)> = Vec::new();
    for attempt in 0..4 {
        let request = long_request(
            &format!("W{attempt}"),
            8_000_000 + attempt,
            args.questions,
            scale,
        );
        let (outcome, wall) = post_read(&client, &url, &request).await?;
        let s = &outcome.stats;
        println!(
            "  calibration {attempt}: scale {scale:.3} → {} prompt tokens in {} read(s), {:.0} ms",
            s.prompt_tokens,
            s.reads,
            1e3 * wall
        );
        if s.reads != 1 {
            return Err(format!(
                "{} questions took {} reads on this checkpoint's canvas: pass a smaller \
                 --questions",
                args.questions, s.reads
            ));
        }
        let tokens = s.prompt_tokens as f64;
        points.push((scale, tokens));
        if (PROMPT_MIN..=PROMPT_MAX).contains(&s.prompt_tokens) {
            break;
        }
        // Secant through the last two points; the first step assumes tokens ∝ scale.
        scale = match points[..] {
            [.., (x0, y0), (x1, y1)] if (y1 - y0).abs() > 1.0 => {
                x1 + (PROMPT_TARGET - y1) * (x1 - x0) / (y1 - y0)
            }
            _ => scale * PROMPT_TARGET / tokens,
        }
        .max(0.05);
        if attempt == 3 {
            println!("  (prompt length still outside {PROMPT_MIN}–{PROMPT_MAX}; going on)");
        }
    }

    let mut cold = Vec::new();
    for i in 0..args.reps {
        let request = long_request(&format!("{i:02}"), 1_000 + i, args.questions, scale);
        let (outcome, wall) = post_read(&client, &url, &request).await?;
        eprintln!(
            "  cold {i}: {:.0} ms, prompt {} reused {}",
            1e3 * wall,
            outcome.stats.prompt_tokens,
            outcome.stats.reused_tokens
        );
        cold.push((outcome.stats, wall));
    }
    let mut warm = Vec::new();
    for i in 0..args.reps {
        // The question list of cold sample i, a state never read before.
        let request = long_request(&format!("{i:02}"), 2_000 + i, args.questions, scale);
        let (outcome, wall) = post_read(&client, &url, &request).await?;
        eprintln!(
            "  warm {i}: {:.0} ms, prompt {} reused {}",
            1e3 * wall,
            outcome.stats.prompt_tokens,
            outcome.stats.reused_tokens
        );
        warm.push((outcome.stats, wall));
    }
    let gauges = warm.last().and_then(|(s, _)| s.engine);
    let blas = sidecar.blas.clone();
    let memory = sidecar.stop();

    let med = |v: &[(ReadStats, f64)], f: &dyn Fn(&ReadStats, f64) -> f64| {
        median(v.iter().map(|(s, w)| f(s, *w)).collect())
    };
    println!(
        "\n{:<6} {:>5} {:>7} {:>7} {:>6} {:>11} {:>11} {:>11}",
        "", "reads", "prompt", "reused", "hits", "prefill", "denoise", "wall"
    );
    for (label, v) in [("cold", &cold), ("warm", &warm)] {
        println!(
            "{:<6} {:>5} {:>7} {:>7} {:>6} {:>8.0} ms {:>8.0} ms {:>8.0} ms",
            label,
            v.len(),
            med(v, &|s, _| s.prompt_tokens as f64),
            med(v, &|s, _| s.reused_tokens as f64),
            med(v, &|s, _| s.cache_hits as f64),
            1e3 * med(v, &|s, _| s.prefill_seconds),
            1e3 * med(v, &|s, _| s.denoise_seconds),
            1e3 * med(v, &|_, w| w),
        );
    }
    println!("(medians; wall = HTTP round trip; each read is one model read: stats.reads == 1)");
    if let Some(g) = gauges {
        println!(
            "prefix cache after the run: {} chunks, {:.1} MB of K/V",
            g.cache_entries,
            g.cache_bytes as f64 / 1e6
        );
    }
    let cold_reused = med(&cold, &|s, _| s.reused_tokens as f64);
    if cold_reused > 0.0 {
        println!(
            "(a cold read still reuses {cold_reused:.0} tokens: the whole chunks of the fixed \
             preamble and chat header that every prompt starts with, before any question text)"
        );
    }
    let cold_wall = med(&cold, &|_, w| w);
    let warm_wall = med(&warm, &|_, w| w);
    let ratio = warm_wall / cold_wall;
    println!("prefix cache warm/cold latency: {ratio:.2}");
    Ok(CacheSummary {
        blas,
        prompt_tokens: med(&cold, &|s, _| s.prompt_tokens as f64) as u64,
        cold_ms: 1e3 * cold_wall,
        warm_ms: 1e3 * warm_wall,
        reused: med(&warm, &|s, _| s.reused_tokens as f64),
        ratio,
        memory,
    })
}
