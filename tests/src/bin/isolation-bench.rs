//! `isolation-bench`: what question isolation costs. One real `hunch-accelerator` sidecar per
//! prefix-cache setting on a generated checkpoint; for 1, 3 and 10 questions, the same request
//! read `joint` (one prompt) and `isolated` (one read per question, sharing forward passes):
//! median latency, input/output tokens, prompt tokens prefilled and reused, forward passes.
//!
//! - cold: a sidecar without a prefix cache, a new state every repetition;
//! - warm: a sidecar with the prefix cache, the same questions and a new state every repetition
//!   (after one unmeasured warm-up), so what precedes the state in a prompt is reused.
//!
//! Usage: `cargo run --release -p hunch-e2e --bin isolation-bench -- [--preset tiny|small]
//! [--reps N]`. Prints the machine, then one line per case and the isolated/joint ratios. Figures
//! in docs/benchmarks.md ("Isolated vs joint").

use hunch_core::{Question, QuestionKind, QuestionMode, ReadOptions, ReadOutcome, ReadRequest};
use hunch_e2e::bench::{everyday_questions, median, option, Flags, ReadySidecar as Sidecar};
use hunch_e2e::{ensure_random_checkpoint, target_dir};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Args {
    preset: String,
    reps: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        preset: "small".into(),
        reps: 5,
    };
    let mut flags = Flags::from_env();
    while let Some(a) = flags.next_flag() {
        match a.as_str() {
            "--preset" => args.preset = flags.value(&a)?,
            "--reps" => args.reps = flags.parsed(&a)?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    Ok(args)
}

/// Ten questions of every kind; a request with `n` asks the first `n`.
fn questions(n: usize) -> Vec<Question> {
    let noul = |text: &str| Question {
        instructions: text.into(),
        kind: QuestionKind::Noul {
            yes: None,
            no: None,
        },
    };
    let mut pool = everyday_questions();
    pool.extend([
        noul("Does the customer ask for a refund?"),
        noul("Is the customer angry?"),
        noul("Does the message mention a card?"),
        Question {
            instructions: "Which language is the message in?".into(),
            kind: QuestionKind::Choice {
                options: vec![
                    option("English", None),
                    option("German", None),
                    option("French", None),
                ],
            },
        },
        noul("Is an email confirmation requested?"),
        Question {
            instructions: "How polite is the message?".into(),
            kind: QuestionKind::Score {
                levels: vec!["Rude".into(), "Neutral".into(), "Polite".into()],
            },
        },
        noul("Is this a repeated complaint?"),
    ]);
    pool.into_iter().take(n).collect()
}

fn state(rep: usize) -> String {
    format!(
        "Ticket #{rep}: I was charged twice for my subscription this month and the second charge \
         is still pending on my card. Please refund one of them and confirm by email. I have \
         been a customer for {rep} years and this is the first time this happens."
    )
}

async fn start_sidecar(accelerator: &Path, dir: &Path, cache_mb: u64) -> Result<Sidecar, String> {
    let args: Vec<String> = [
        "serve",
        "--model",
        &dir.display().to_string(),
        "--prefix-cache-mb",
        &cache_mb.to_string(),
        "--no-batch-probe",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    hunch_e2e::bench::start_ready_sidecar(accelerator, &args, Duration::from_secs(600)).await
}

async fn read(
    client: &reqwest::Client,
    sidecar: &Sidecar,
    request: &ReadRequest,
) -> Result<(f64, ReadOutcome), String> {
    let t = Instant::now();
    let response = client
        .post(format!("{}/read", sidecar.url))
        .json(request)
        .send()
        .await
        .map_err(|e| format!("read: {e}"))?;
    let status = response.status();
    let text = response.text().await.map_err(|e| format!("read: {e}"))?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if !status.is_success() {
        return Err(format!("read answered {status}: {text}"));
    }
    let outcome = serde_json::from_str(&text).map_err(|e| format!("read answer: {e}"))?;
    Ok((ms, outcome))
}

/// One case's figures (medians of latency; tokens of the last repetition, all equal).
#[derive(Default, Clone, Copy)]
struct Figures {
    ms: f64,
    input: u64,
    output: u64,
    prompt: u64,
    reused: u64,
    forwards: u32,
}

async fn case(
    sidecar: &Sidecar,
    n: usize,
    mode: QuestionMode,
    warm: bool,
    reps: usize,
    first_rep: usize,
) -> Result<Figures, String> {
    let client = reqwest::Client::new();
    let request = |rep: usize| ReadRequest {
        state: state(rep),
        questions: questions(n),
        options: ReadOptions {
            questions: mode,
            ..ReadOptions::default()
        },
        asked: None,
    };
    if warm {
        read(&client, sidecar, &request(first_rep + 1_000_000)).await?;
    }
    let mut times = Vec::new();
    let mut last = Figures::default();
    for rep in 0..reps {
        let (ms, outcome) = read(&client, sidecar, &request(first_rep + rep)).await?;
        times.push(ms);
        last = Figures {
            ms: 0.0,
            input: outcome.usage.input_tokens,
            output: outcome.usage.output_tokens,
            prompt: outcome.stats.prompt_tokens,
            reused: outcome.stats.reused_tokens,
            forwards: outcome.stats.forwards,
        };
    }
    last.ms = median(times);
    Ok(last)
}

fn checkpoint(preset: &str) -> Result<PathBuf, String> {
    if !matches!(preset, "tiny" | "small" | "mid") {
        return Err(format!("unknown --preset {preset} (tiny, small, mid)"));
    }
    let dir = target_dir()
        .join("bench-checkpoints")
        .join(format!("{preset}-seed0"));
    ensure_random_checkpoint(&dir, preset, 0, &[]);
    Ok(dir)
}

async fn run() -> Result<(), String> {
    let args = parse_args()?;
    let dir = checkpoint(&args.preset)?;
    let accelerator = hunch_e2e::accelerator_bin();
    let cores = hunch_e2e::bench::cores();
    println!(
        "isolation-bench: {cores} cores (load {}), {} build, preset {} ({}), float32, CPU; \
         {} repetitions per case, latency = median",
        hunch_e2e::bench::load_average(),
        hunch_e2e::bench::build_kind(),
        args.preset,
        dir.display(),
        args.reps
    );
    let mut rows = Vec::new();
    let mut rep = 0;
    for (label, cache_mb, warm) in [("cold", 0u64, false), ("warm", 1024, true)] {
        let sidecar = start_sidecar(&accelerator, &dir, cache_mb).await?;
        println!(
            "sidecar [{label}: prefix cache {cache_mb} MiB] BLAS mapped: {:?}",
            sidecar.blas_libraries
        );
        for n in [1usize, 3, 10] {
            let mut pair = [Figures::default(); 2];
            for (k, mode) in [QuestionMode::Joint, QuestionMode::Isolated]
                .into_iter()
                .enumerate()
            {
                let f = case(&sidecar, n, mode, warm, args.reps, rep).await?;
                rep += args.reps + 1;
                println!(
                    "  {label} {n:>2} questions {:<8}: {:>8.1} ms  usage in/out {:>5}/{:<4} \
                     prefilled {:>5} reused {:>5} forwards {:>3}",
                    mode.as_str(),
                    f.ms,
                    f.input,
                    f.output,
                    f.prompt,
                    f.reused,
                    f.forwards
                );
                pair[k] = f;
            }
            rows.push((label, n, pair));
        }
    }
    println!("\n== isolated / joint ==");
    println!("case         latency   input tokens   prompt tokens prefilled (net of reuse)");
    for (label, n, [joint, isolated]) in rows {
        let net = |f: &Figures| f.prompt.saturating_sub(f.reused).max(1) as f64;
        println!(
            "{label} {n:>2} q   {:>6.2}x   {:>11.2}x   {:>11.2}x",
            isolated.ms / joint.ms,
            isolated.input as f64 / joint.input.max(1) as f64,
            net(&isolated) / net(&joint)
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    hunch_e2e::bench::exit_code("isolation-bench", run().await)
}
