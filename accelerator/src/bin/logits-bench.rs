//! `logits-bench`: the label-logit read against llama.cpp on the same GGUF and cores (or mlx-lm on
//! the same Hugging Face folder), measured in one run (docs/benchmarks.md, "Label-logit read
//! against llama.cpp").
//!
//! Plans `--requests` requests of three questions sharing a support-ticket state (simple-jev v1
//! prompts through the model's own template), reads them through [`CausalEngine`] (prefix cache
//! on, as served), then hands the very same token ids to llama-cpp-python for a GGUF file, or
//! mlx-lm for a folder (`scripts/bench_logits_peer.py`, run by `--peer-python`), which reuses its
//! KV cache over the common prefix of consecutive sequences. Prints per-question latency (p50 of the warm rounds),
//! prompt tokens per second, the ratio Hunch / llama.cpp, the machine, and the resident peak
//! (`VmHWM`: one engine loaded and reading, as a sidecar holds it) beside the file's size.
//!
//!     logits-bench --model M.gguf [--requests 12] [--rounds 3] [--mode isolated|joint]
//!                  [--chunk 32] [--kernels auto|mlx|native] [--activation-bits 16|8]
//!                  [--affine-weights auto|quantized|dense] [--peer-python PY] [--threads N]
//!                  [--dump-requests FILE]
//!
//! `--dump-requests FILE` also writes the requests as `POST /v1/systemone` bodies (one JSON per
//! line, model `bench`), for `scripts/bench_logits_http.py`, which reads them through a running
//! `hunch serve`: the same reads with the host and HTTP around them.

use hunch_accelerator::tools::bench::{machine, median, resident_peak, spread};
use std::path::PathBuf;
use std::time::Instant;

use hunch_accelerator::checkpoint::causal::AffineWeights;
use hunch_accelerator::engine::{CausalEngine, CausalEngineOptions};
use hunch_accelerator::model::causal::cpu::kernels::quant::Precision;
use hunch_accelerator::model::causal::CausalKernels;
use hunch_core::{ChoiceOption, Question, QuestionKind, QuestionMode, ReadOptions, ReadRequest};

struct Args {
    model: PathBuf,
    requests: usize,
    rounds: usize,
    mode: QuestionMode,
    chunk: usize,
    kernels: CausalKernels,
    activations: Precision,
    affine: AffineWeights,
    peer_python: Option<String>,
    threads: usize,
    dump_requests: Option<PathBuf>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        model: PathBuf::new(),
        requests: 12,
        rounds: 3,
        mode: QuestionMode::Isolated,
        chunk: hunch_accelerator::model::causal::DEFAULT_CAUSAL_CHUNK,
        kernels: CausalKernels::Auto,
        activations: Precision::Fine,
        affine: AffineWeights::Auto,
        peer_python: None,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        dump_requests: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => args.model = PathBuf::from(value()?),
            "--requests" => args.requests = value()?.parse().map_err(|e| format!("{e}"))?,
            "--rounds" => args.rounds = value()?.parse().map_err(|e| format!("{e}"))?,
            "--chunk" => args.chunk = value()?.parse().map_err(|e| format!("{e}"))?,
            "--kernels" => args.kernels = value()?.parse().map_err(|e| format!("{e}"))?,
            "--activation-bits" => args.activations = value()?.parse()?,
            "--affine-weights" => {
                args.affine = match value()?.as_str() {
                    "auto" => AffineWeights::Auto,
                    "quantized" => AffineWeights::Quantized,
                    "dense" => AffineWeights::Dense,
                    other => {
                        return Err(format!(
                            "--affine-weights {other:?}: auto, quantized or dense"
                        ))
                    }
                }
            }
            "--threads" => args.threads = value()?.parse().map_err(|e| format!("{e}"))?,
            "--peer-python" => args.peer_python = Some(value()?),
            "--dump-requests" => args.dump_requests = Some(PathBuf::from(value()?)),
            "--mode" => {
                args.mode = match value()?.as_str() {
                    "isolated" => QuestionMode::Isolated,
                    "joint" => QuestionMode::Joint,
                    other => return Err(format!("--mode {other:?}: isolated or joint")),
                }
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.model.as_os_str().is_empty() {
        return Err("--model PATH is required".into());
    }
    Ok(args)
}

/// Request `n`: a ticket of about 300 tokens (distinct from its first sentence, so requests share
/// only the fixed system text) and three questions.
fn request(n: usize, mode: QuestionMode) -> ReadRequest {
    let ticket = format!(
        "Ticket #{n}. From: customer {n}. Subject: charged twice. Hello, I have been a subscriber \
         for three years and this month I noticed two identical charges of 9.99 on my card, one \
         on the 3rd and one on the 4th. The second one is still pending. I only have one account \
         and I did not change my plan. I tried the self-service refund page but it says the \
         charge is not eligible because it is pending. I also called the hotline twice and was \
         put on hold for forty minutes each time before the call dropped. I am travelling next \
         week and need the money on my card. Please refund the duplicate charge, confirm by \
         email, and tell me why this happened so that it does not happen again. My invoice \
         numbers are INV-{n}-001 and INV-{n}-002. I would also like to know whether my loyalty \
         discount still applies after this. Thank you, and sorry for the long message."
    );
    let option = |name: &str, description: Option<&str>| ChoiceOption {
        name: name.into(),
        description: description.map(str::to_owned),
    };
    ReadRequest {
        state: ticket,
        questions: vec![
            Question {
                instructions: "Is this message about billing?".into(),
                kind: QuestionKind::Noul {
                    yes: None,
                    no: None,
                },
            },
            Question {
                instructions: "Which team should handle it?".into(),
                kind: QuestionKind::Choice {
                    options: vec![
                        option("billing", Some("Payments and refunds")),
                        option("technical", None),
                        option("sales team", Some("New purchases")),
                    ],
                },
            },
            Question {
                instructions: "How urgent is it?".into(),
                kind: QuestionKind::Score {
                    levels: vec!["Can wait".into(), "This week".into(), "Today".into()],
                },
            },
        ],
        options: ReadOptions {
            questions: mode,
            ..ReadOptions::default()
        },
        asked: None,
    }
}

/// `request` as a System One body (the wire's names for what `ReadRequest` carries).
fn wire_body(r: &ReadRequest) -> serde_json::Value {
    let questions: serde_json::Map<String, serde_json::Value> = r
        .questions
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let body = match &q.kind {
                QuestionKind::Noul { .. } => {
                    serde_json::json!({"type": "noul", "instructions": q.instructions})
                }
                QuestionKind::Choice { options } => {
                    let criteria: serde_json::Map<String, serde_json::Value> = options
                        .iter()
                        .map(|o| (o.name.clone(), serde_json::json!(o.description)))
                        .collect();
                    serde_json::json!({"type": "choice", "instructions": q.instructions,
                                       "criteria": criteria})
                }
                QuestionKind::Score { levels } => {
                    serde_json::json!({"type": "score", "instructions": q.instructions,
                                       "criteria": levels})
                }
            };
            (format!("q{i}"), body)
        })
        .collect();
    let mode = match r.options.questions {
        QuestionMode::Isolated => "isolated",
        QuestionMode::Joint => "joint",
    };
    serde_json::json!({"model": "bench", "state": r.state, "questions": questions,
                       "x_questions": mode})
}

fn main() -> std::process::ExitCode {
    // Before any thread starts: it sets an environment variable OpenBLAS reads when it loads.
    hunch_accelerator::blas::prefer_avx512_openblas();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("logits-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args = parse()?;
    let load_started = Instant::now();
    let options = CausalEngineOptions {
        prefill_chunk: args.chunk,
        kernels: args.kernels,
        activations: args.activations,
        affine: args.affine,
        ..CausalEngineOptions::default()
    };
    let mut engine = CausalEngine::load(&args.model, &options).map_err(|e| e.to_string())?;
    let kernels = engine.model().kernels_name();
    let load_seconds = load_started.elapsed().as_secs_f64();
    eprintln!("loaded in {load_seconds:.2} s");
    let requests: Vec<ReadRequest> = (0..args.requests).map(|n| request(n, args.mode)).collect();
    if let Some(path) = &args.dump_requests {
        let lines: String = requests
            .iter()
            .map(|r| wire_body(r).to_string() + "\n")
            .collect();
        std::fs::write(path, lines).map_err(|e| format!("{}: {e}", path.display()))?;
    }

    // The sequences, for the peer: exactly the ids Hunch reads.
    let mut planned = Vec::new();
    for r in &requests {
        let plan = engine.planner().plan(r).map_err(|e| e.to_string())?;
        let seqs: Vec<serde_json::Value> = plan
            .sequences
            .iter()
            .map(|s| serde_json::json!({"tokens": s.tokens, "labels": s.labels}))
            .collect();
        planned.push(seqs);
    }
    let questions: usize = planned.iter().map(Vec::len).sum();
    let prompt_tokens: usize = planned
        .iter()
        .flatten()
        .map(|s| s["tokens"].as_array().map_or(0, Vec::len))
        .sum();

    // Hunch: round 0 warms (and fills the prefix cache as a server's first requests would);
    // each later round starts from an empty cache so it pays the same prefills.
    let mut hunch_rounds: Vec<(f64, u64)> = Vec::new();
    for round in 0..=args.rounds {
        if round > 0 {
            // The previous round's model goes first, so two are never held at once: the
            // resident peak printed below is one engine's, as a sidecar's would be.
            drop(engine);
            engine = CausalEngine::load(&args.model, &options).map_err(|e| e.to_string())?;
        }
        let started = Instant::now();
        let mut computed = 0u64;
        for r in &requests {
            let one = Instant::now();
            let outcome = engine.read(r).map_err(|e| e.to_string())?;
            eprintln!(
                "round {round}: {:.2} s, {} prompt tokens, {} reused",
                one.elapsed().as_secs_f64(),
                outcome.stats.prompt_tokens,
                outcome.stats.reused_tokens
            );
            computed += outcome.stats.prompt_tokens - outcome.stats.reused_tokens;
        }
        if round > 0 {
            hunch_rounds.push((started.elapsed().as_secs_f64(), computed));
        }
    }
    if let Some(peak) = resident_peak() {
        let file = std::fs::metadata(&args.model).map_or(0, |m| m.len());
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let ratio = if file > 0 {
            peak as f64 / file as f64
        } else {
            0.0
        };
        println!(
            "memory     : resident peak (VmHWM) {:.0} MiB, the file {:.0} MiB: {ratio:.2}x",
            mib(peak),
            mib(file)
        );
    }
    let hunch_warm: Vec<f64> = hunch_rounds
        .iter()
        .map(|(s, _)| s / questions as f64)
        .collect();
    let hunch_per_question = median(hunch_warm.clone());
    let hunch_computed = hunch_rounds.first().map_or(0, |r| r.1);

    println!("logits-bench: {}", args.model.display());
    println!("machine: {}", machine());
    println!(
        "read: {} requests x 3 questions ({:?}), {prompt_tokens} prompt tokens, chunk {}, \
         kernels {kernels} (--kernels {}), load {load_seconds:.2} s",
        args.requests, args.mode, args.chunk, args.kernels
    );
    println!(
        "hunch      : {:.1} ms/question (p50 of {} rounds, {}), {hunch_computed} tokens \
         computed, {:.0} computed tokens/s",
        hunch_per_question * 1e3,
        args.rounds,
        spread(&hunch_warm),
        hunch_computed as f64 / (hunch_per_question * questions as f64)
    );

    let Some(python) = args.peer_python else {
        println!(
            "peer       : not run (--peer-python PY: a Python with llama-cpp-python for a GGUF, \
             mlx-lm for a folder)"
        );
        return Ok(());
    };
    let dir = std::env::temp_dir().join(format!("logits-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let path = dir.join("sequences.json");
    std::fs::write(&path, serde_json::json!({"requests": planned}).to_string())
        .map_err(|e| e.to_string())?;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/bench_logits_peer.py"
    );
    let output = std::process::Command::new(&python)
        .arg(script)
        .arg(&path)
        .arg(&args.model)
        .arg(args.threads.to_string())
        .arg((args.rounds + 1).to_string())
        .output()
        .map_err(|e| format!("running {python}: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    if !output.status.success() {
        return Err(format!(
            "the peer (scripts/bench_logits_peer.py) failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let peer: serde_json::Value =
        serde_json::from_slice(&output.stdout).map_err(|e| format!("peer output: {e}"))?;
    let rounds = peer["rounds"].as_array().cloned().unwrap_or_default();
    let warm: Vec<f64> = rounds
        .iter()
        .skip(1)
        .map(|rows| {
            rows.as_array().map_or(0.0, |r| {
                r.iter().filter_map(|x| x["seconds"].as_f64()).sum()
            }) / questions as f64
        })
        .collect();
    let peer_per_question = median(warm.clone());
    let runtime = peer["runtime"].as_str().unwrap_or("peer");
    let peer_evaluated: u64 = rounds.get(1).and_then(|r| r.as_array()).map_or(0, |r| {
        r.iter().filter_map(|x| x["evaluated"].as_u64()).sum()
    });
    println!(
        "{runtime:<11}: {:.1} ms/question (p50 of {} rounds, {}), {peer_evaluated} tokens \
         evaluated, {:.0} evaluated tokens/s, version {}, {} threads",
        peer_per_question * 1e3,
        rounds.len().saturating_sub(1),
        spread(&warm),
        peer_evaluated as f64 / (peer_per_question * questions as f64),
        peer["version"].as_str().unwrap_or("?"),
        args.threads
    );
    println!(
        "ratio hunch / {runtime} (time per question): {:.2}x",
        hunch_per_question / peer_per_question
    );
    Ok(())
}
