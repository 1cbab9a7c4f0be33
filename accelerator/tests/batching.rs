//! Batch invariance and prefix-cache exactness, on a random checkpoint written by the test: the
//! same requests read alone, in random batches, interleaved with other requests, from a warm
//! prefix cache, under a tight memory budget — every answer bit-identical (f64 `==`) to the
//! request read alone with the cache off, and to the one-read-at-a-time driver
//! (`read::execute`).
//!
//! The checkpoint has a sliding window (24) that is not a multiple of the test's prefill chunk
//! (16) and prompts of several hundred tokens, so windowed attention across chunk boundaries and
//! the sliding layers' tails restored from the cache are both exercised.
//!
//! Bit-exactness is a property of the matmul kernels: these tests pin the backend they check,
//! the MLX wheel's reference BLAS (row-independent sums), through `blas::select`. Engines here
//! batch with `Batching::On` unless a test checks the default.

use hunch_accelerator::blas::{self, BlasChoice};
use hunch_accelerator::checkpoint::Layout;
use hunch_accelerator::engine::{EngineOptions, MlxEngine, ModelDenoiser};
use hunch_accelerator::read::diffusion::{execute, ReadSettings};
use hunch_accelerator::scheduler::{measure_batch_deviation, Batching, Reply, SchedulerConfig};
use hunch_accelerator::server::ReadEngine;
use hunch_accelerator::tools::{write_random_checkpoint, DenseDtype, Preset, RandomSpec};
use hunch_core::{LabelDistribution, ReadError, ReadOutcome, ReadRequest};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

const CHUNK: usize = 16;

/// The checkpoint, written once per test binary.
fn checkpoint() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spec = RandomSpec::new(Preset::Tiny, Layout::Hf);
        spec.seed = 606;
        spec.dtype = DenseDtype::F32;
        for kv in [
            "vocab_size=1024",
            "top.canvas_length=32",
            "sliding_window=24",
        ] {
            spec.set(kv).expect("override");
        }
        write_random_checkpoint(dir.path(), &spec).expect("random checkpoint");
        dir
    })
    .path()
}

fn config(max_requests: usize, max_rows: usize, cache_bytes: u64) -> SchedulerConfig {
    SchedulerConfig {
        max_requests,
        batching: Batching::On,
        max_rows,
        kv_budget_bytes: 1 << 30,
        prefill_chunk: CHUNK,
        cache_bytes,
    }
}

fn engine(config: SchedulerConfig) -> MlxEngine {
    engine_probed(config, false)
}

fn engine_probed(config: SchedulerConfig, probe_batching: bool) -> MlxEngine {
    blas::select(BlasChoice::Reference).expect("pin the reference BLAS");
    MlxEngine::load(
        checkpoint(),
        &EngineOptions {
            scheduler: config,
            probe_batching,
            ..EngineOptions::default()
        },
    )
    .expect("load")
}

/// A small xorshift generator: the test's batches are random but reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn request(value: Value) -> ReadRequest {
    serde_json::from_value(value).expect("request")
}

/// A question list long enough to span several chunks; shared by several requests.
fn support_questions() -> Value {
    json!([
        {"type": "choice", "instructions": "Which team should handle this ticket",
         "options": [{"name": "billing", "description": "Payment, invoices, refunds and subscription issues"},
                     {"name": "technical", "description": "Bugs, crashes, errors and performance problems"},
                     {"name": "account", "description": "Login, password, profile and permission problems"},
                     {"name": "sales", "description": null}]},
        {"type": "score", "instructions": "How frustrated the customer appears",
         "levels": ["Calm and polite", "Mildly annoyed", "Clearly upset", "Furious, threatening to leave"]},
        {"type": "noul", "instructions": "The message conveys urgency", "yes": "Needs action today", "no": null},
        {"type": "noul", "instructions": "The customer asks for money back", "yes": null, "no": null}
    ])
}

fn requests() -> Vec<ReadRequest> {
    let states = [
        "My card was charged twice this month and the app keeps crashing when I open the invoices page!",
        "Hi, could you tell me whether the enterprise plan includes single sign-on? Thanks.",
        "I cannot log in since yesterday; the password reset email never arrives. I need this fixed today.",
        "{\"order\": 17, \"status\": \"late\", \"note\": \"Zoë a payé deux fois — 重复扣款\"}",
    ];
    let mut out: Vec<ReadRequest> = states
        .iter()
        .map(|s| request(json!({"state": s, "questions": support_questions(), "options": {}})))
        .collect();
    let many: Vec<Value> = (0..12)
        .map(|i| json!({"type": "noul", "instructions": format!("Statement {i}: the customer mentions item {i}."), "yes": null, "no": null}))
        .collect();
    // Several reads in one request (a canvas of 32 holds few questions).
    out.push(request(
        json!({"state": "Order 17 arrived late and item 3 was missing.", "questions": many, "options": {}}),
    ));
    // Fixed draws and seed.
    out.push(request(
        json!({"state": "Refund please, the parcel never came.", "questions": [
        {"type": "noul", "instructions": "Is this a refund request?", "yes": null, "no": null}],
        "options": {"seed": 7, "draws": 5}}),
    ));
    // A forced question next to a read.
    out.push(request(json!({"state": "x", "questions": [
        {"type": "choice", "instructions": "only", "options": [{"name": "one", "description": null}]},
        {"type": "noul", "instructions": "Is x a letter?", "yes": null, "no": null}], "options": {}})));
    out
}

type Answer = Result<ReadOutcome, ReadError>;

/// Runs `requests` through one engine: submits them in `order`, running `steps_between[i]`
/// scheduler steps before submitting the i-th, then steps until every answer is in.
fn run(
    engine: &mut MlxEngine,
    requests: &[ReadRequest],
    order: &[usize],
    gaps: &[usize],
) -> Vec<Answer> {
    let answers: Arc<Mutex<Vec<Option<Answer>>>> = Arc::new(Mutex::new(vec![None; requests.len()]));
    let pending = |answers: &Arc<Mutex<Vec<Option<Answer>>>>| {
        answers
            .lock()
            .expect("lock")
            .iter()
            .filter(|a| a.is_none())
            .count()
    };
    for (&i, &gap) in order.iter().zip(gaps) {
        for _ in 0..gap {
            engine.step();
        }
        while !engine.has_room() {
            engine.step();
        }
        let sink = answers.clone();
        engine.submit(
            requests[i].clone(),
            Reply::new(move |a| sink.lock().expect("lock")[i] = Some(a)),
        );
    }
    let mut guard = 0;
    while pending(&answers) > 0 {
        engine.step();
        guard += 1;
        assert!(guard < 100_000, "the scheduler does not finish");
    }
    let answers = answers.lock().expect("lock").clone();
    answers.into_iter().map(|a| a.expect("answered")).collect()
}

/// Bit-identical (f64 `==`).
fn assert_same(a: &[LabelDistribution], b: &[LabelDistribution], what: impl std::fmt::Display) {
    assert_eq!(a, b, "{what}");
}

fn distributions(answer: &Answer) -> &[LabelDistribution] {
    &answer.as_ref().expect("read succeeded").distributions
}

/// Every request read alone, cache off: the baseline.
fn alone() -> &'static Vec<Answer> {
    static ALONE: OnceLock<Vec<Answer>> = OnceLock::new();
    ALONE.get_or_init(|| {
        let mut engine = engine(config(1, 4096, 0));
        requests().iter().map(|r| engine.read(r)).collect()
    })
}

#[test]
fn the_scheduler_alone_equals_the_one_read_at_a_time_driver() {
    let engine = engine(config(1, 4096, 0));
    let settings = ReadSettings { rereads: true };
    let denoiser = ModelDenoiser {
        model: engine.model(),
        chunk: CHUNK,
    };
    for (i, request) in requests().iter().enumerate() {
        let sequential = execute(engine.planner(), &denoiser, &settings, request).expect("execute");
        assert_same(
            &sequential.distributions,
            distributions(&alone()[i]),
            format!("request {i}: scheduler alone and execute differ"),
        );
    }
}

#[test]
fn answers_are_bit_identical_alone_and_in_random_batches() {
    let requests = requests();
    let mut rng = Rng(0x5eed_1234_abcd);
    let mut worst_batch = 0;
    for round in 0..4 {
        // Random batch limits: from one request at a time to all at once, rows from a few
        // chunks to everything.
        let max_requests = 1 + rng.below(requests.len() + 2);
        let max_rows = [24, 48, 100, 4096][rng.below(4)];
        let cache = if round % 2 == 0 { 0 } else { 64 << 20 };
        let mut engine = engine_probed(config(max_requests, max_rows, cache), true);
        // Each request twice, in a random order, with random gaps: some arrive together, some
        // interleave with work already in flight.
        let mut order: Vec<usize> = (0..requests.len()).chain(0..requests.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let gaps: Vec<usize> = order.iter().map(|_| [0, 0, 1, 3][rng.below(4)]).collect();
        let doubled: Vec<ReadRequest> = order.iter().map(|&i| requests[i].clone()).collect();
        let identity: Vec<usize> = (0..doubled.len()).collect();
        let answers = run(&mut engine, &doubled, &identity, &gaps);
        for (k, (&i, answer)) in order.iter().zip(&answers).enumerate() {
            assert_same(
                distributions(answer),
                distributions(&alone()[i]),
                format!(
                    "round {round} (max_requests {max_requests}, max_rows {max_rows}): answer \
                     {k} (request {i}) differs from the request read alone"
                ),
            );
            let stats = &answer.as_ref().expect("ok").stats;
            worst_batch = worst_batch.max(stats.max_batch_requests);
            if stats.max_batch_requests > 1 {
                let deviation = stats
                    .batch_deviation
                    .expect("batched answers carry the deviation");
                assert_eq!(deviation, 0.0);
            } else {
                assert_eq!(
                    stats.batch_deviation, None,
                    "an answer read alone claims none"
                );
            }
        }
    }
    assert!(
        worst_batch > 1,
        "no round batched two requests together; the test proves nothing"
    );
}

#[test]
fn a_warm_prefix_cache_answers_bit_identically_to_a_cold_prefill() {
    let requests = requests();
    let mut engine = engine(config(1, 4096, 64 << 20));
    // First: cold.
    let cold = engine.read(&requests[0]).expect("cold");
    assert_eq!(cold.stats.reused_tokens, 0);
    assert_eq!(cold.stats.cache_hits, 0);
    assert_same(&cold.distributions, distributions(&alone()[0]), "cold");
    // The same request again: its whole chunk-aligned prompt comes from the cache.
    let again = engine.read(&requests[0]).expect("again");
    let prompt = again.stats.prompt_tokens as usize;
    assert_eq!(again.stats.reused_tokens as usize, prompt / CHUNK * CHUNK);
    assert_eq!(again.stats.cache_hits, 1);
    assert_same(&again.distributions, &cold.distributions, "warm again");
    // Same questions, a new state: the system turn (the question list) is reused.
    for (i, request) in requests.iter().enumerate().take(4).skip(1) {
        let warm = engine.read(request).expect("warm");
        assert!(
            warm.stats.reused_tokens >= 10 * CHUNK as u64,
            "request {i} reused only {} tokens of its question list",
            warm.stats.reused_tokens
        );
        assert!((warm.stats.reused_tokens as usize) < warm.stats.prompt_tokens as usize);
        assert_same(
            &warm.distributions,
            distributions(&alone()[i]),
            format!("request {i}: warm answer differs from the cold one"),
        );
        let gauges = warm.stats.engine.expect("gauges");
        assert!(gauges.cache_bytes > 0 && gauges.cache_entries > 0);
    }
}

#[test]
fn a_small_cache_evicts_and_a_tight_memory_budget_queues_without_changing_answers() {
    let requests = requests();
    // Room for a handful of chunks only: constant eviction.
    let chunk_bytes = {
        let probe = engine(config(1, 4096, 64 << 20));
        let mut probe = probe;
        let outcome = probe.read(&requests[0]).expect("read");
        let gauges = outcome.stats.engine.expect("gauges");
        gauges.cache_bytes / gauges.cache_entries.max(1)
    };
    let mut small = SchedulerConfig {
        kv_budget_bytes: 1,
        ..config(8, 64, 5 * chunk_bytes)
    };
    small.max_requests = 8;
    let mut engine = engine(small);
    let order: Vec<usize> = (0..requests.len()).chain(0..requests.len()).collect();
    let doubled: Vec<ReadRequest> = order.iter().map(|&i| requests[i].clone()).collect();
    let identity: Vec<usize> = (0..doubled.len()).collect();
    let answers = run(&mut engine, &doubled, &identity, &vec![0; doubled.len()]);
    for (&i, answer) in order.iter().zip(&answers) {
        assert_same(
            distributions(answer),
            distributions(&alone()[i]),
            format!("request {i}"),
        );
        let gauges = answer.as_ref().expect("ok").stats.engine.expect("gauges");
        assert!(
            gauges.cache_bytes <= 5 * chunk_bytes,
            "cache holds {} bytes over its capacity {}",
            gauges.cache_bytes,
            5 * chunk_bytes
        );
    }
}

#[test]
fn concurrent_identical_prompts_compute_their_shared_chunks_once() {
    let requests = requests();
    let mut engine = engine(config(8, 4096, 64 << 20));
    let same: Vec<ReadRequest> = vec![requests[0].clone(); 4];
    let answers = run(&mut engine, &same, &[0, 1, 2, 3], &[0, 0, 0, 0]);
    let reused: u64 = answers
        .iter()
        .map(|a| a.as_ref().expect("ok").stats.reused_tokens)
        .sum();
    let prompt = answers[0].as_ref().expect("ok").stats.prompt_tokens;
    // The first computes every chunk; the other three take every full chunk from the cache.
    assert_eq!(reused, 3 * (prompt / CHUNK as u64) * CHUNK as u64);
    assert_eq!(
        engine.scheduler().counters().prefilled_tokens,
        prompt + 3 * (prompt % CHUNK as u64),
    );
    for a in &answers {
        assert_same(
            distributions(a),
            distributions(&alone()[0]),
            "identical prompts",
        );
    }
}

#[test]
fn the_startup_probe_measures_zero_deviation_on_the_reference_blas() {
    let engine = engine(config(1, 4096, 0));
    let deviation = measure_batch_deviation(engine.model(), CHUNK).expect("probe");
    eprintln!("batch deviation: {deviation:e}");
    assert_eq!(
        deviation, 0.0,
        "batched math is not bit-exact on the reference BLAS"
    );
}

/// The default (`Batching::Auto`) where the probe measured a deviation — OpenBLAS on the CPU,
/// float32 on CUDA — reads requests one at a time, so answers equal the read alone; where it
/// measured 0 it batches; `Batching::On` batches anyway and reports the figure.
#[test]
fn the_default_on_a_deviating_backend_reads_requests_alone() {
    let requests: Vec<ReadRequest> = requests().into_iter().take(3).collect();
    let order: Vec<usize> = (0..requests.len()).collect();
    let gaps = vec![0; requests.len()];
    let default_config = SchedulerConfig {
        prefill_chunk: CHUNK,
        ..SchedulerConfig::default()
    };
    assert_eq!(default_config.batching, Batching::Auto);
    let cases = [
        (Batching::Auto, Some(3.0e-3), false),
        (Batching::Auto, None, false),
        (Batching::Auto, Some(0.0), true),
        (Batching::On, Some(3.0e-3), true),
    ];
    for (batching, deviation, batches) in cases {
        let mut engine = engine(SchedulerConfig {
            batching,
            cache_bytes: 0,
            ..default_config.clone()
        });
        engine.scheduler_mut().set_batch_deviation(deviation);
        let limit = engine.scheduler().request_limit();
        assert_eq!(
            limit > 1,
            batches,
            "{batching} with {deviation:?}: limit {limit}"
        );
        let answers = run(&mut engine, &requests, &order, &gaps);
        let most = answers
            .iter()
            .map(|a| a.as_ref().expect("ok").stats.max_batch_requests)
            .max()
            .unwrap_or(0);
        assert_eq!(
            most > 1,
            batches,
            "{batching} with {deviation:?}: {most} shared"
        );
        for (i, answer) in answers.iter().enumerate() {
            assert_same(
                distributions(answer),
                distributions(&alone()[i]),
                format!("{batching} with {deviation:?}: request {i}"),
            );
            let stats = &answer.as_ref().expect("ok").stats;
            let expected = if stats.max_batch_requests > 1 {
                deviation
            } else {
                None
            };
            assert_eq!(stats.batch_deviation, expected, "{batching}: request {i}");
        }
    }
}

#[test]
fn a_request_whose_client_went_away_is_dropped_and_the_others_are_unaffected() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let requests = requests();
    let mut engine = engine(config(8, 4096, 64 << 20));
    let gone = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicBool::new(false));
    let (flag, seen) = (gone.clone(), answered.clone());
    engine.submit(
        requests[4].clone(),
        Reply::new(move |_| seen.store(true, Ordering::SeqCst))
            .with_abandoned(move || flag.load(Ordering::SeqCst)),
    );
    let kept: Arc<Mutex<Option<Answer>>> = Arc::default();
    let sink = kept.clone();
    engine.submit(
        requests[0].clone(),
        Reply::new(move |a| *sink.lock().expect("lock") = Some(a)),
    );
    engine.step();
    gone.store(true, Ordering::SeqCst);
    let mut guard = 0;
    while kept.lock().expect("lock").is_none() {
        engine.step();
        guard += 1;
        assert!(guard < 10_000, "the other request never finished");
    }
    assert!(
        !answered.load(Ordering::SeqCst),
        "the abandoned request was still answered"
    );
    assert_eq!(engine.scheduler().counters().abandoned, 1);
    assert!(
        engine.scheduler().is_idle(),
        "the abandoned request is still in flight"
    );
    let answer = kept.lock().expect("lock").take().expect("answer");
    assert_same(
        distributions(&answer),
        distributions(&alone()[0]),
        "the request kept",
    );
}
