//! `laya-bench`: the laya read (docs/models.md, "laya: an encoder read at mask markers") against
//! llama.cpp's encoder on the same weights, token ids and cores, in one run, at a real model's
//! shapes (`scripts/bench_laya_gguf.py` writes a Julia-1-shaped file; `scripts/bench-laya.sh` runs
//! both).
//!
//! Builds `--requests` requests of three questions (a noul, a 4-option choice, a 4-level score)
//! over support-ticket states of a few hundred tokens, each request's state its own (so nothing a
//! request reads was read before), and reads them through [`EncoderEngine::read`] as the sidecar
//! does, `--rounds` times; the first round warms and is not counted. With `--peer-python PY` (a
//! Python with llama-cpp-python) it writes the very sequences Hunch ran (`planner().plan`) to a
//! temporary file and runs `scripts/bench_laya_peer.py` on `--peer-model` (default: the model's
//! encoder-only copy, `M.encoder.gguf`), which times one `llama_decode` of each sequence, every
//! position an output, the same rounds.
//!
//! The two sides do not do the same work: Hunch's time is the whole read (the template, the
//! tokenizer, the encoder, the laya head's blocks over every position and the scorer at the
//! markers), llama.cpp's is its encoder alone, because llama.cpp 0.3.36 has no laya head
//! (llama-server's laya read is a later release's, and its loader refuses the head's blocks).
//! So the head's cost is not llama.cpp's to pay here; the bench prints the head's share of
//! Hunch's multiply-adds over these sequences, from the file's shapes, beside the ratio.
//!
//!     laya-bench --model M.gguf [--requests 8] [--rounds 3] [--peer-python PY]
//!                [--peer-model M.encoder.gguf] [--threads N]
//!
//! Prints the time per question (p50 of the warm rounds, their spread in brackets) for both, the
//! ratio Hunch / llama.cpp, prompt tokens per second, the machine (CPU, cores, the kernel copies
//! `hunch_kernels` picks and how many of the encoder's matrices run on them, the BLAS) and
//! Hunch's resident peak (`VmHWM`: one engine loaded and
//! reading, as a sidecar holds it) beside the file's size.
//!
//! The small statistics helpers mirror `logits-bench`'s, which are private to that binary.

use hunch_accelerator::tools::bench::{machine, median, resident_peak, spread};
use std::path::{Path, PathBuf};
use std::time::Instant;

use hunch_accelerator::checkpoint::gguf::GgufFile;
use hunch_accelerator::engine::{CausalEngineOptions, EncoderEngine};
use hunch_accelerator::model::encoder::{ModernBert, ModernBertConfig};
use hunch_accelerator::model::linear::Linear;
use hunch_core::{ChoiceOption, Question, QuestionKind, ReadOptions, ReadRequest};

struct Args {
    model: PathBuf,
    requests: usize,
    rounds: usize,
    peer_python: Option<String>,
    peer_model: Option<PathBuf>,
    threads: usize,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        model: PathBuf::new(),
        requests: 8,
        rounds: 3,
        peer_python: None,
        peer_model: None,
        threads: hunch_kernels::threads(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let count = |v: String| v.parse::<usize>().map_err(|e| format!("{flag} {v:?}: {e}"));
        match flag.as_str() {
            "--model" => args.model = PathBuf::from(value()?),
            "--requests" => args.requests = count(value()?)?,
            "--rounds" => args.rounds = count(value()?)?,
            "--threads" => args.threads = count(value()?)?,
            "--peer-python" => args.peer_python = Some(value()?),
            "--peer-model" => args.peer_model = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.model.as_os_str().is_empty() {
        return Err("--model PATH is required (scripts/bench_laya_gguf.py writes one)".into());
    }
    if args.requests == 0 {
        return Err("--requests must be at least 1".into());
    }
    if args.rounds < 2 {
        return Err(format!(
            "--rounds {}: the first round warms and is not counted, so at least 2",
            args.rounds
        ));
    }
    Ok(args)
}

/// Request `n`'s state: a support ticket of a few hundred tokens whose customer, numbers and
/// problem (one of four) are its own from the first sentence.
fn ticket(n: usize) -> String {
    const NAMES: [&str; 5] = [
        "Ana Ruiz",
        "Tomasz Nowak",
        "Priya Raman",
        "Kwame Mensah",
        "Li Wei",
    ];
    const PLANS: [&str; 3] = ["Basic", "Family", "Business"];
    let problem = match n % 4 {
        0 => format!(
            "This month I noticed two identical charges of {}.99 on my card, one on the 3rd and \
             one on the 4th. The second one is still pending. I only have one account and I did \
             not change my plan. The self-service refund page says the charge is not eligible \
             because it is pending, and the chat assistant kept sending me back to that page.",
            9 + n % 7
        ),
        1 => format!(
            "Since the update on Tuesday the app logs me out every few minutes and the web \
             dashboard shows error {} when I open the reports tab. I cleared the cache, \
             reinstalled the app on two phones and tried another browser, with the same result. \
             My team of {} people cannot export the weekly figures, and our deadline is Friday.",
            500 + n % 4,
            3 + n % 9
        ),
        2 => format!(
            "My order of {} items was marked as delivered on Monday, but nothing arrived. The \
             courier's photo shows a door that is not mine, and my neighbours have not seen the \
             parcel. The tracking page now says the order is closed. One of the items was a \
             birthday present, so I need either the parcel found or a replacement sent quickly.",
            2 + n % 5
        ),
        _ => format!(
            "This morning I got {} emails saying my password was changed and a new device signed \
             in from a city I have never visited. I did not do either. I can still sign in with \
             the old password on my laptop, but I am worried that someone has my card details, \
             since the account has my saved payment method and my home address on it.",
            2 + n % 3
        ),
    };
    format!(
        "Ticket #{n}. From: {} (customer {}, {} plan, subscriber for {} years). Hello, {problem} \
         I also called the hotline twice and was put on hold for forty minutes each time before \
         the call dropped. I am travelling next week and will only have my phone with me. Please \
         tell me what happened, what you will do about it, and confirm everything by email so \
         that I have it in writing. My reference numbers are REF-{n}-{:03} and REF-{n}-{:03}. I \
         would also like to know whether my loyalty discount still applies after all this, and \
         whether I should change anything on my side so that it does not happen again. Thank \
         you, and sorry for the long message.",
        NAMES[n % NAMES.len()],
        1000 + 37 * n,
        PLANS[n % PLANS.len()],
        1 + n % 6,
        (7 * n) % 1000,
        (7 * n + 1) % 1000,
    )
}

/// Request `n`: its ticket and three questions, as a client of `POST /v1/systemone` would ask.
fn request(n: usize) -> ReadRequest {
    let option = |name: &str, description: &str| ChoiceOption {
        name: name.into(),
        description: Some(description.into()),
    };
    ReadRequest {
        state: ticket(n),
        questions: vec![
            Question {
                instructions: "Is the customer asking for money back?".into(),
                kind: QuestionKind::Noul {
                    yes: None,
                    no: None,
                },
            },
            Question {
                instructions: "Which team should handle this ticket?".into(),
                kind: QuestionKind::Choice {
                    options: vec![
                        option("billing", "Payments, charges and refunds"),
                        option("technical", "Apps, errors and outages"),
                        option("shipping", "Orders, couriers and deliveries"),
                        option("security", "Accounts, passwords and fraud"),
                    ],
                },
            },
            Question {
                instructions: "How urgent is it?".into(),
                kind: QuestionKind::Score {
                    levels: vec![
                        "Can wait".into(),
                        "This week".into(),
                        "Today".into(),
                        "Within the hour".into(),
                    ],
                },
            },
        ],
        options: ReadOptions::default(),
        asked: None,
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// How many of the encoder's matrices were packed for the native integer products at load (the
/// rest run on MLX's operations), of how many.
fn packed_matrices(encoder: &ModernBert) -> (usize, usize) {
    let matrices: Vec<&Linear> = encoder
        .layers
        .iter()
        .flat_map(|l| [&l.attention.qkv, &l.attention.output, &l.up, &l.down])
        .collect();
    let packed = matrices
        .iter()
        .filter(|m| matches!(m, Linear::Packed(_)))
        .count();
    (packed, matrices.len())
}

/// Multiply-adds per token of the file's matrices: the encoder's layers', the head's blocks',
/// and how many head blocks there are (tensors `blk.L.*.weight` of two dims; `L` past the
/// encoder's layers is the head's).
struct MatrixWork {
    encoder: u64,
    head: u64,
    head_blocks: usize,
}

fn matrix_work(path: &Path, encoder_layers: usize) -> Result<MatrixWork, String> {
    let file = GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut work = MatrixWork {
        encoder: 0,
        head: 0,
        head_blocks: 0,
    };
    for info in file.tensors() {
        let Some(block) = info
            .name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|b| b.parse::<usize>().ok())
        else {
            continue;
        };
        if info.dims.len() != 2 || !info.name.ends_with(".weight") {
            continue;
        }
        if block < encoder_layers {
            work.encoder += info.elements();
        } else {
            work.head += info.elements();
            work.head_blocks = work.head_blocks.max(block - encoder_layers + 1);
        }
    }
    Ok(work)
}

/// The multiply-adds of one `n`-token sequence: (the encoder's, the head's blocks'). Matrices
/// from the file's shapes, attention's scores and weighted values (`2 · hidden` per query and
/// key) over every key on global layers and the head, within the window on windowed layers.
/// Left out, on both sides: norms, the embedding's gather, the scorer at the markers.
fn multiply_adds(work: &MatrixWork, config: &ModernBertConfig, n: usize) -> (u64, u64) {
    if n == 0 {
        return (0, 0);
    }
    let per_key = 2 * config.hidden as u64;
    let global_keys = (n * n) as u64;
    let window_keys: u64 = (0..n)
        .map(|i| (i + config.window).min(n - 1) - i.saturating_sub(config.window) + 1)
        .map(|k| k as u64)
        .sum();
    let attention: u64 = (0..config.layers)
        .map(|l| {
            if config.is_local(l) {
                window_keys
            } else {
                global_keys
            }
        })
        .sum::<u64>()
        * per_key;
    let encoder = n as u64 * work.encoder + attention;
    let head = n as u64 * work.head + work.head_blocks as u64 * global_keys * per_key;
    (encoder, head)
}

fn main() -> std::process::ExitCode {
    // Before any thread starts: it sets an environment variable OpenBLAS reads when it loads.
    hunch_accelerator::blas::prefer_avx512_openblas();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("laya-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args = parse()?;
    let load_started = Instant::now();
    let mut engine = EncoderEngine::load(&args.model, &CausalEngineOptions::default())
        .map_err(|e| e.to_string())?;
    let load_seconds = load_started.elapsed().as_secs_f64();
    eprintln!("loaded in {load_seconds:.2} s");
    let requests: Vec<ReadRequest> = (0..args.requests).map(request).collect();

    // The sequences, for the peer: exactly the ids Hunch reads.
    let mut planned = Vec::new();
    for r in &requests {
        let plan = engine.planner().plan(r).map_err(|e| e.to_string())?;
        let seqs: Vec<serde_json::Value> = plan
            .sequences
            .iter()
            .map(|s| serde_json::json!({"question": s.question, "tokens": s.tokens}))
            .collect();
        planned.push(seqs);
    }
    let lengths: Vec<usize> = planned
        .iter()
        .flatten()
        .map(|s| s["tokens"].as_array().map_or(0, Vec::len))
        .collect();
    let sequences = lengths.len();
    let questions: usize = requests.iter().map(|r| r.questions.len()).sum();
    let prompt_tokens: usize = lengths.iter().sum();

    let config = engine.encoder().config.clone();
    let work = matrix_work(&args.model, config.layers)?;
    let (encoder_work, head_work) = lengths
        .iter()
        .map(|&n| multiply_adds(&work, &config, n))
        .fold((0, 0), |(e, h), (de, dh)| (e + de, h + dh));
    let head_share = head_work as f64 / (encoder_work + head_work) as f64;

    // Hunch: every round reads every request; the first warms.
    let mut hunch_warm = Vec::new();
    let mut forward_warm = Vec::new();
    for round in 0..args.rounds {
        let started = Instant::now();
        let mut forward = 0.0;
        for r in &requests {
            let outcome = engine.read(r).map_err(|e| e.to_string())?;
            forward += outcome.stats.prefill_seconds;
        }
        let seconds = started.elapsed().as_secs_f64();
        eprintln!("hunch round {round}: {seconds:.2} s ({forward:.2} s encoder and head)");
        if round > 0 {
            hunch_warm.push(seconds / questions as f64);
            forward_warm.push(forward / questions as f64);
        }
    }
    let hunch_per_question = median(hunch_warm.clone());
    let file_bytes = std::fs::metadata(&args.model).map_or(0, |m| m.len());

    println!("laya-bench: {}", args.model.display());
    println!("machine: {}", machine());
    println!(
        "model: {} encoder layers + {} head blocks, hidden {}, {} heads, ffn {}, window {} \
         (each side), vocab {}; load {load_seconds:.2} s",
        config.layers,
        work.head_blocks,
        config.hidden,
        config.heads,
        config.ffn,
        config.window,
        engine.encoder().vocab
    );
    let (packed, matrices) = packed_matrices(engine.encoder());
    println!(
        "products: {packed} of the encoder's {matrices} matrices on the native integer products \
         ({}, activations {}), the rest on MLX",
        hunch_kernels::quant::quant_isa().name(),
        engine.kernels().precision.name()
    );
    println!(
        "read: {} requests x 3 questions, {sequences} sequences, {prompt_tokens} prompt tokens \
         ({}-{} a sequence), {} rounds (the first a warm-up)",
        args.requests,
        lengths.iter().min().copied().unwrap_or(0),
        lengths.iter().max().copied().unwrap_or(0),
        args.rounds
    );
    println!(
        "hunch      : {:.1} ms/question (p50 of {} warm rounds, {}; of which encoder and head \
         {:.1} ms), {:.0} prompt tokens/s, {} threads",
        hunch_per_question * 1e3,
        hunch_warm.len(),
        spread(&hunch_warm),
        median(forward_warm) * 1e3,
        prompt_tokens as f64 / (hunch_per_question * questions as f64),
        hunch_kernels::threads()
    );
    match resident_peak() {
        Some(peak) => println!(
            "memory     : hunch resident peak (VmHWM) {:.0} MiB, the file {:.0} MiB: {:.2}x",
            mib(peak),
            mib(file_bytes),
            peak as f64 / file_bytes.max(1) as f64
        ),
        None => println!("memory     : no /proc/self/status here, resident peak unknown"),
    }
    println!(
        "head       : the laya head's blocks are {:.1}% of Hunch's multiply-adds over these \
         sequences (from the file's shapes); llama.cpp below runs the encoder alone",
        head_share * 100.0
    );

    let Some(python) = args.peer_python else {
        println!("llama.cpp  : not run (--peer-python PY: a Python with llama-cpp-python)");
        return Ok(());
    };
    let peer_model = match args.peer_model {
        Some(path) => path,
        None => {
            let name = args.model.to_string_lossy();
            let stem = name.strip_suffix(".gguf").ok_or_else(|| {
                format!(
                    "{}: no --peer-model, and the model's name does not end in .gguf to find \
                     its encoder-only copy beside it",
                    args.model.display()
                )
            })?;
            PathBuf::from(format!("{stem}.encoder.gguf"))
        }
    };
    if !peer_model.is_file() {
        return Err(format!(
            "{}: no encoder-only copy for llama.cpp (scripts/bench_laya_gguf.py writes it \
             beside the laya file)",
            peer_model.display()
        ));
    }
    let dir = std::env::temp_dir().join(format!("laya-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("sequences.json");
    std::fs::write(&path, serde_json::json!({"requests": planned}).to_string())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/bench_laya_peer.py");
    let output = std::process::Command::new(&python)
        .arg(script)
        .arg(&path)
        .arg(&peer_model)
        .arg(args.threads.to_string())
        .arg(args.rounds.to_string())
        .output()
        .map_err(|e| format!("running {python}: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    if !output.status.success() {
        return Err(format!(
            "the peer (scripts/bench_laya_peer.py) failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let peer: serde_json::Value =
        serde_json::from_slice(&output.stdout).map_err(|e| format!("the peer's output: {e}"))?;
    let rounds = peer["rounds"]
        .as_array()
        .ok_or("the peer's output has no rounds")?;
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
    let peer_mib = peer["peak_rss_bytes"]
        .as_u64()
        .map_or("?".into(), |b| format!("{:.0}", mib(b)));
    println!(
        "llama.cpp  : {:.1} ms/question (p50 of {} warm rounds, {}), {:.0} prompt tokens/s, \
         llama-cpp-python {}, {} threads, encoder only ({}, {:.0} MiB), its process's resident \
         peak {peer_mib} MiB",
        peer_per_question * 1e3,
        warm.len(),
        spread(&warm),
        prompt_tokens as f64 / (peer_per_question * questions as f64),
        peer["version"].as_str().unwrap_or("?"),
        args.threads,
        peer_model.display(),
        mib(std::fs::metadata(&peer_model).map_or(0, |m| m.len()))
    );
    println!(
        "llama.cpp system info: {}",
        peer["system_info"].as_str().unwrap_or("?").trim()
    );
    println!(
        "ratio hunch / llama.cpp (time per question): {:.2}x (hunch's includes the head, {:.1}% \
         of its multiply-adds)",
        hunch_per_question / peer_per_question,
        head_share * 100.0
    );
    Ok(())
}
