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

use hunch_core::{Question, QuestionKind, ReadOptions, ReadOutcome, ReadRequest, ReadStats};
use hunch_e2e::bench::{mapped_blas, median, option, percentile, read_request};
use hunch_e2e::{ensure_random_checkpoint, start_process, target_dir, Process};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The default checkpoint: the `small` preset's compute (hidden 512, 6 layers, 4 of the experts
/// per token) with a 32k vocabulary and 96 experts per layer, so the weights are a few hundred MB
/// on disk (like a real MoE, most of them idle for any one token) while a read stays fast enough
/// for a CPU. `mid` (≈815 MB) computes ~10× more per token.
const SMALL_WIDE_SETS: &[&str] = &["vocab_size=32768", "num_experts=96"];

struct Args {
    preset: String,
    ckpt: Option<PathBuf>,
    clients: usize,
    seconds: f64,
    reps: usize,
    questions: usize,
    dtype: String,
    only: Option<String>,
}

const USAGE: &str = "batch-bench [--preset small-wide|tiny|small|mid] [--ckpt DIR] [--clients N] \
[--seconds S] [--reps N] [--questions N] [--dtype float32|bfloat16] [--only throughput|cache]

  --preset     random checkpoint to write and use (default small-wide: the small preset with a
               32k vocabulary and 96 experts, a few hundred MB); ignored with --ckpt
  --clients    concurrent clients of the throughput part (default 8)
  --seconds    how long the clients post, per run (default 30)
  --reps       cold and warm samples of the prefix-cache part (default 5)
  --questions  questions of the long prompt (default 12; all must fit one read's canvas)
  --dtype      activation dtype of the sidecars (default float32)
  --only       run one part only";

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        preset: "small-wide".into(),
        ckpt: None,
        clients: 8,
        seconds: 30.0,
        reps: 5,
        questions: 12,
        dtype: "float32".into(),
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--preset" => a.preset = value()?,
            "--ckpt" => a.ckpt = Some(PathBuf::from(value()?)),
            "--clients" => a.clients = value()?.parse().map_err(|e| format!("--clients: {e}"))?,
            "--seconds" => a.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--reps" => a.reps = value()?.parse().map_err(|e| format!("--reps: {e}"))?,
            "--questions" => {
                a.questions = value()?.parse().map_err(|e| format!("--questions: {e}"))?
            }
            "--dtype" => a.dtype = value()?,
            "--only" => a.only = Some(value()?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if a.reps == 0 || a.clients == 0 || a.questions == 0 || a.seconds.is_nan() || a.seconds <= 0.0 {
        return Err("--reps, --clients, --questions and --seconds must be positive".into());
    }
    if !matches!(a.only.as_deref(), None | Some("throughput") | Some("cache")) {
        return Err("--only takes throughput or cache".into());
    }
    Ok(a)
}

// ---------------------------------------------------------------------------------------------
// Small helpers (the shared ones are in `hunch_e2e::bench`).
// ---------------------------------------------------------------------------------------------

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// A `/proc/PID/status` memory field (`VmHWM`: peak resident set, `VmRSS`: resident now), in MB.
fn status_mb(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0 / 1e6)
}

/// A sidecar's resident memory just before it was stopped.
#[derive(Clone, Copy, Default)]
struct MemoryUse {
    peak_mb: Option<f64>,
    now_mb: Option<f64>,
}

impl MemoryUse {
    fn show(&self) -> String {
        format!(
            "{} (resident at the end {})",
            fmt_opt(self.peak_mb, "MB"),
            fmt_opt(self.now_mb, "MB")
        )
    }
}

/// The `deviation=` of the sidecar's start-up probe log line.
fn probe_deviation_logged(logs: &str) -> Option<String> {
    let line = logs
        .lines()
        .find(|l| l.contains("batch invariance probe"))?;
    let rest = &line[line.find("deviation=")? + "deviation=".len()..];
    Some(rest.split_whitespace().next().unwrap_or("").to_string())
}

fn fmt_opt(v: Option<f64>, unit: &str) -> String {
    v.map(|v| format!("{v:.0} {unit}"))
        .unwrap_or_else(|| "unknown".into())
}

// ---------------------------------------------------------------------------------------------
// Requests.
// ---------------------------------------------------------------------------------------------

/// Sentences the long prompt's instructions and states are cut from.
const FILLER: &[&str] = &[
    "Consider the whole conversation, not only the last message, and weigh what the customer \
     actually asks for over the words they happen to use.",
    "When the message quotes an earlier reply from our team, judge the customer's own words and \
     ignore the quoted part.",
    "Messages written in a hurry often leave out details; do not penalise missing punctuation, \
     spelling mistakes or an informal tone.",
    "If two readings are equally plausible, prefer the one that would lead to the safer outcome \
     for the customer.",
    "Amounts, dates and order numbers mentioned in the message are reliable; claims about what \
     another department said are not.",
    "A polite message can still be urgent, and an angry message is not urgent by itself.",
    "Treat screenshots described in words as if they were attached, and treat links as \
     unverified.",
    "The customer may write in the first or the third person, for example on behalf of a family \
     member or a colleague.",
    "Do not infer anything from the customer's name, location or the time the message was sent.",
    "Answer from the message as written; do not assume facts about the account that the message \
     does not state.",
];

const TICKET: &str = "I was charged twice for my subscription this month and the second charge \
is still pending on my card.";

/// `len` characters (cut at a word boundary) of the filler text, starting at sentence `offset`.
fn filler(offset: usize, len: usize) -> String {
    let mut text = String::new();
    let mut i = offset;
    while text.len() < len + 200 {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(FILLER[i % FILLER.len()]);
        i += 1;
    }
    let cut = text[..len.min(text.len())].rfind(' ').unwrap_or(0).min(len);
    text.truncate(cut);
    text
}

/// The short core of each long-prompt question: (instructions, choice options or none = noul).
fn long_question_core(i: usize) -> (&'static str, Option<[&'static str; 3]>) {
    const CORES: &[(&str, Option<[&str; 3]>)] = &[
        ("Is the customer asking for a refund?", None),
        (
            "Which team should handle this ticket?",
            Some(["billing", "technical", "sales"]),
        ),
        (
            "Does the customer mention a specific amount of money?",
            None,
        ),
        (
            "What is the customer's overall mood?",
            Some(["calm", "frustrated", "angry"]),
        ),
        ("Is the customer threatening to cancel?", None),
        (
            "Which channel should we reply on?",
            Some(["email", "phone", "chat"]),
        ),
        (
            "Does the message contain personal data we must redact?",
            None,
        ),
        (
            "How long has the problem lasted?",
            Some(["today", "this week", "longer"]),
        ),
        ("Has the customer already contacted us about this?", None),
        (
            "What does the customer want first?",
            Some(["money back", "an answer", "a fix"]),
        ),
        ("Is a manager's approval needed?", None),
        (
            "Which product is concerned?",
            Some(["subscription", "hardware", "add-on"]),
        ),
    ];
    CORES[i % CORES.len()]
}

/// The long question list of cache sample `sample`: `count` nouls and 3-option choices, each with
/// `filler_chars` characters of guidance. The first question starts with the sample number, so two
/// samples share no prompt chunk.
fn long_questions(sample: &str, count: usize, filler_chars: usize) -> Vec<Question> {
    (0..count)
        .map(|i| {
            let (core, options) = long_question_core(i);
            let head = if i == 0 {
                format!("Sample {sample}. ")
            } else {
                String::new()
            };
            let instructions = format!("{head}{core} {}", filler(i, filler_chars));
            let kind = match options {
                None => QuestionKind::Noul {
                    yes: None,
                    no: None,
                },
                Some(names) => QuestionKind::Choice {
                    options: names.iter().map(|n| option(n, None)).collect(),
                },
            };
            Question { instructions, kind }
        })
        .collect()
}

/// A state of the long-prompt part, unique from its first character on.
fn long_state(n: usize, filler_chars: usize) -> String {
    format!(
        "{n} is this ticket's number. {TICKET} {}",
        filler(n, filler_chars)
    )
}

// ---------------------------------------------------------------------------------------------
// The sidecar.
// ---------------------------------------------------------------------------------------------

struct Sidecar {
    url: String,
    process: Process,
    load_seconds: f64,
}

fn http_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(3600))
        .build()
        .map_err(|e| format!("building the HTTP client: {e}"))
}

async fn start_sidecar(
    accelerator: &Path,
    dir: &Path,
    dtype: &str,
    extra: &[&str],
) -> Result<Sidecar, String> {
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--model".into(),
        dir.display().to_string(),
        "--dtype".into(),
        dtype.into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let started = Instant::now();
    let (url, process) = start_process(
        &accelerator.to_path_buf(),
        &args,
        &[],
        "HUNCH_ACCELERATOR_LISTENING ",
    );
    let client = http_client()?;
    loop {
        let h: serde_json::Value = client
            .get(format!("{url}/health"))
            .send()
            .await
            .map_err(|e| format!("GET {url}/health: {e}"))?
            .json()
            .await
            .map_err(|e| format!("GET {url}/health: {e}"))?;
        match h["state"].as_str() {
            Some("ready") => break,
            Some("failed") => {
                return Err(format!(
                    "the sidecar failed to load: {h}\n{}",
                    process.logs()
                ))
            }
            _ if started.elapsed() > Duration::from_secs(1200) => {
                return Err(format!("the sidecar did not load in 20 minutes: {h}"))
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    Ok(Sidecar {
        url,
        process,
        load_seconds: started.elapsed().as_secs_f64(),
    })
}

impl Sidecar {
    fn describe(&self, label: &str) {
        println!(
            "  sidecar [{label}] pid {}: ready in {:.1} s, BLAS mapped: {:?}, start-up probe \
             deviation={}",
            self.process.pid(),
            self.load_seconds,
            mapped_blas(self.process.pid()),
            probe_deviation_logged(&self.process.logs()).unwrap_or_else(|| "(not logged)".into())
        );
    }

    /// Reads the peak and current RSS, then stops the process.
    fn stop(self) -> MemoryUse {
        let pid = self.process.pid();
        let memory = MemoryUse {
            peak_mb: status_mb(pid, "VmHWM"),
            now_mb: status_mb(pid, "VmRSS"),
        };
        drop(self.process);
        memory
    }
}

/// Posts one read; returns the outcome and the HTTP round trip in seconds.
async fn post_read(
    client: &reqwest::Client,
    url: &str,
    request: &ReadRequest,
) -> Result<(ReadOutcome, f64), String> {
    let t = Instant::now();
    let r = client
        .post(format!("{url}/read"))
        .json(request)
        .send()
        .await
        .map_err(|e| format!("POST {url}/read: {e}"))?;
    if !r.status().is_success() {
        return Err(format!(
            "POST {url}/read: {} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        ));
    }
    let outcome: ReadOutcome = r
        .json()
        .await
        .map_err(|e| format!("POST {url}/read: reading the answer: {e}"))?;
    Ok((outcome, t.elapsed().as_secs_f64()))
}

// ---------------------------------------------------------------------------------------------
// Part 1: throughput with batching off and on.
// ---------------------------------------------------------------------------------------------

struct ThroughputRun {
    blas: Vec<String>,
    reads: usize,
    elapsed: f64,
    latencies: Vec<f64>,
    stats: Vec<ReadStats>,
    /// State index → the distributions answered for it.
    answers: HashMap<usize, Vec<Vec<f64>>>,
    memory: MemoryUse,
}

impl ThroughputRun {
    fn reads_per_second(&self) -> f64 {
        self.reads as f64 / self.elapsed
    }
}

async fn throughput_run(
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
        blas: mapped_blas(sidecar.process.pid()),
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

fn print_throughput_row(label: &str, run: &ThroughputRun) {
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
fn compare_answers(
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

struct ThroughputSummary {
    blas: Vec<String>,
    speedup: f64,
    identical: String,
    deviation: Option<f64>,
    memory_off: MemoryUse,
    memory_on: MemoryUse,
}

async fn throughput_part(
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

// ---------------------------------------------------------------------------------------------
// Part 2: the prefix cache, cold against warm, on a ~1.5k-token prompt.
// ---------------------------------------------------------------------------------------------

const PROMPT_MIN: u64 = 1400;
const PROMPT_MAX: u64 = 1700;
const PROMPT_TARGET: f64 = 1550.0;
/// Filler characters per question and per state at scale 1 (≈1.5k tokens for a
/// character-level tokenizer such as the random checkpoints' and 12 questions).
const QUESTION_FILLER: f64 = 20.0;
const STATE_FILLER: f64 = 250.0;

struct CacheSummary {
    blas: Vec<String>,
    prompt_tokens: u64,
    cold_ms: f64,
    warm_ms: f64,
    reused: f64,
    ratio: f64,
    memory: MemoryUse,
}

fn long_request(sample: &str, state: usize, questions: usize, scale: f64) -> ReadRequest {
    let q_chars = (QUESTION_FILLER * scale * 12.0 / questions as f64).round() as usize;
    let s_chars = (STATE_FILLER * scale).round() as usize;
    ReadRequest {
        state: long_state(state, s_chars),
        questions: long_questions(sample, questions, q_chars),
        options: ReadOptions::default(),
    }
}

async fn cache_part(args: &Args, accelerator: &Path, dir: &Path) -> Result<CacheSummary, String> {
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
    let blas = mapped_blas(sidecar.process.pid());
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

// ---------------------------------------------------------------------------------------------

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
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let accelerator = hunch_e2e::accelerator_bin();
    let dir = checkpoint(&args)?;
    let bytes: u64 = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "batch-bench: {cores} cores, load average {}, {} build; checkpoint {} ({}, {:.0} MB on \
         disk); dtype {}; LD_PRELOAD={}; OPENBLAS_NUM_THREADS={}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        if cfg!(debug_assertions) {
            "DEBUG"
        } else {
            "release"
        },
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
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("batch-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
