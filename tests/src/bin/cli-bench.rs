//! Benchmark of `hunch batch` (not a test: it prints figures and asserts nothing about timing).
//!
//! ```text
//! cargo build --release -p hunch-accelerator -p hunch-e2e --bin cli-bench --bin hunch-e2e-server --bin hunch-accelerator
//! target/release/cli-bench [--requests 1000] [--clients 8] [--concurrency 16] [--questions 8]
//!                          [--ckpt DIR | --preset tiny] [--sidecar-arg ARG]...
//! ```
//!
//! One `hunch serve` with the real sidecar on a generated checkpoint (or `--ckpt DIR`). The same
//! workload three ways, each over its own distinct states (so no answer is served twice): N
//! System One requests sharing one question list (`--questions` questions with descriptions,
//! several prefill chunks long) —
//! 1. one by one: a single client, one request at a time;
//! 2. `--clients` concurrent clients, each sending its share one at a time;
//! 3. `hunch batch -i IN.jsonl -o OUT.jsonl --server URL --concurrency C` (the real binary).
//!
//! Prints reads/s of each, the ratios against one-by-one, and the prefix-cache hit rate of each
//! phase (`hunch_model_prefix_cache_hits_total` / `hunch_model_prefills_total` from `/metrics`).

use hunch::cli::batch::summary::{parse_cache_counters, CacheCounters};
use hunch_e2e::{ensure_random_checkpoint, hunch_bin, start_hunch_with, target_dir, wait_ready};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

struct Options {
    requests: usize,
    clients: usize,
    concurrency: usize,
    questions: usize,
    ckpt: Option<PathBuf>,
    preset: String,
    sidecar_args: Vec<String>,
}

fn options() -> Options {
    let mut o = Options {
        requests: 1000,
        clients: 8,
        concurrency: 16,
        questions: 8,
        ckpt: None,
        preset: "tiny".into(),
        sidecar_args: Vec::new(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        let number = || value.parse::<usize>().expect("a number");
        match args[i].as_str() {
            "--requests" => o.requests = number(),
            "--clients" => o.clients = number(),
            "--concurrency" => o.concurrency = number(),
            "--questions" => o.questions = number(),
            "--ckpt" => o.ckpt = Some(value.into()),
            "--preset" => o.preset = value,
            "--sidecar-arg" => o.sidecar_args.push(value),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    o
}

/// The shared question list: noul, choice and score questions with descriptions, long enough to
/// span several prefill chunks.
fn question_list(n: usize) -> Value {
    let mut questions = Map::new();
    for i in 0..n {
        let q = match i % 3 {
            0 => json!({"type": "noul", "instructions": format!(
                "Question {i}: does the customer explicitly ask for money back, a refund, a credit \
                 note or a chargeback on their card for any of the charges they describe?")}),
            1 => json!({"type": "choice", "instructions": format!(
                "Question {i}: which team should take this ticket first?"),
                "criteria": {"billing": "Payments, invoices, refunds and double charges",
                             "technical": "Outages, errors, crashes and integrations",
                             "sales": "New purchases, upgrades and seat counts",
                             "account": "Logins, passwords, ownership and deletion"}}),
            _ => json!({"type": "score", "instructions": format!(
                "Question {i}: how urgent is the ticket for the customer's business?"),
                "criteria": ["It can wait a week", "It should be handled this week",
                             "It should be handled today", "Production is down right now"]}),
        };
        questions.insert(format!("q{i}"), q);
    }
    Value::Object(questions)
}

/// Request `k` of phase `phase`: unique state, the shared list.
fn body(phase: &str, k: usize, questions: &Value) -> Value {
    json!({
        "model": "jev-latest",
        "state": format!("[{phase} {k}] Hello, I was charged twice for order #{} this month and \
                          the second charge is still pending. Please refund it.", 10_000 + k),
        "questions": questions,
    })
}

async fn cache(url: &str) -> CacheCounters {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .expect("/metrics")
        .text()
        .await
        .expect("a body");
    parse_cache_counters(&text).unwrap_or_default()
}

struct Phase {
    name: String,
    seconds: f64,
    reads: usize,
    cache: CacheCounters,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.reads as f64 / self.seconds
    }
}

async fn clients(url: &str, bodies: Vec<Value>, clients: usize) -> usize {
    let http = reqwest::Client::new();
    let per = bodies.len().div_ceil(clients);
    let mut tasks = Vec::new();
    for chunk in bodies.chunks(per.max(1)) {
        let chunk = chunk.to_vec();
        let http = http.clone();
        let url = format!("{url}/v1/systemone");
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for b in chunk {
                let r = http.post(&url).json(&b).send().await.expect("sent");
                assert!(
                    r.status().is_success(),
                    "{}",
                    r.text().await.unwrap_or_default()
                );
                ok += 1;
            }
            ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.expect("a client");
    }
    ok
}

async fn measure<F: std::future::Future<Output = usize>>(name: &str, url: &str, run: F) -> Phase {
    let before = cache(url).await;
    let started = Instant::now();
    let reads = run.await;
    let seconds = started.elapsed().as_secs_f64();
    let after = cache(url).await;
    let phase = Phase {
        name: name.to_string(),
        seconds,
        reads,
        cache: CacheCounters {
            prefills: after.prefills - before.prefills,
            hits: after.hits - before.hits,
        },
    };
    eprintln!("{name}: {reads} reads in {seconds:.1} s");
    phase
}

#[tokio::main]
async fn main() {
    let o = options();
    let ckpt = o.ckpt.clone().unwrap_or_else(|| {
        let dir = target_dir()
            .join("bench-checkpoints")
            .join(format!("cli-{}", o.preset));
        ensure_random_checkpoint(&dir, &o.preset, 7, &["vocab_size=4096"]);
        dir
    });
    let model = format!("bench={}", ckpt.display());
    let mut args = vec![
        "--model",
        model.as_str(),
        "--request-timeout",
        "600",
        "--max-queued-reads",
        "4096",
    ];
    let sidecar: Vec<String> = o
        .sidecar_args
        .iter()
        .map(|a| format!("--sidecar-arg={a}"))
        .collect();
    args.extend(sidecar.iter().map(String::as_str));
    let accelerator = target_dir().join("hunch-accelerator");
    let server = start_hunch_with(
        &args,
        &[(
            "HUNCH_ACCELERATOR_BIN",
            accelerator.to_string_lossy().into_owned(),
        )],
    );
    wait_ready(&server.url, Duration::from_secs(600)).await;
    let url = server.url.clone();
    let questions = question_list(o.questions);
    // Warm-up: the question list's chunks enter the cache once, for every phase alike.
    clients(&url, vec![body("warm-up", 0, &questions)], 1).await;

    let n = o.requests;
    let seq: Vec<Value> = (0..n).map(|k| body("one-by-one", k, &questions)).collect();
    let one = measure("one by one", &url, clients(&url, seq, 1)).await;
    let conc: Vec<Value> = (0..n).map(|k| body("clients", k, &questions)).collect();
    let many = measure(
        &format!("{} concurrent clients", o.clients),
        &url,
        clients(&url, conc, o.clients),
    )
    .await;

    let dir = std::env::temp_dir().join(format!("cli-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let input = dir.join("in.jsonl");
    let output = dir.join("out.jsonl");
    let lines: Vec<String> = (0..n)
        .map(|k| {
            json!({"custom_id": format!("r{k}"), "method": "POST", "url": "/v1/systemone",
                   "body": body("batch", k, &questions)})
            .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n")).expect("write the input");
    let concurrency = o.concurrency.to_string();
    let batch = measure(
        &format!("hunch batch --concurrency {}", o.concurrency),
        &url,
        async {
            let out = tokio::process::Command::new(hunch_bin())
                .args(["batch", "-i"])
                .arg(&input)
                .arg("-o")
                .arg(&output)
                .args([
                    "--server",
                    &url,
                    "--concurrency",
                    &concurrency,
                    "--progress",
                    "off",
                ])
                .output()
                .await
                .expect("hunch batch runs");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
            std::fs::read_to_string(&output)
                .map(|t| t.lines().count())
                .unwrap_or(0)
        },
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);

    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    println!(
        "cli-bench: {n} requests, {} questions each (one shared list), checkpoint {}, {cores} cores",
        o.questions,
        ckpt.display()
    );
    println!("| how | reads/s | × one by one | prefix-cache hits |");
    println!("|---|---|---|---|");
    for p in [&one, &many, &batch] {
        println!(
            "| {} | {:.2} | {:.2}× | {}/{} ({:.0}%) |",
            p.name,
            p.rate(),
            p.rate() / one.rate(),
            p.cache.hits,
            p.cache.prefills,
            100.0 * p.cache.hits as f64 / p.cache.prefills.max(1) as f64
        );
    }
}
