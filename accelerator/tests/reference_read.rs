//! Fidelity: Hunch's read against an independent Python reference of the same read
//! (`tests/reference/reference_read.py`: oMLX's read logic on mlx_vlm 0.7.10's DiffusionGemma),
//! on random checkpoints written for this test (so no golden file can be tuned to it), in
//! float32. Prompts, canvases and slots must be identical token for token; probabilities within
//! 1e-3.
//!
//! Needs the reference venv: `tests/reference/setup.sh .venv-reference` (CI runs it). Set
//! `HUNCH_REFERENCE_PYTHON` to use another interpreter. Without the venv the test fails and says
//! how to make it, unless `HUNCH_TEST_SKIP=reference` says to skip it on purpose.

use hunch_accelerator::checkpoint::Layout;
use hunch_accelerator::engine::{EngineOptions, MlxEngine};
use hunch_accelerator::tools::{write_random_checkpoint, DenseDtype, Preset, RandomSpec};
use hunch_core::{ReadError, ReadRequest};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn reference_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HUNCH_REFERENCE_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let p = workspace_root().join(".venv-reference/bin/python");
    p.exists().then_some(p)
}

fn checkpoint(dir: &Path, seed: u64, sets: &[&str]) {
    let mut spec = RandomSpec::new(Preset::Tiny, Layout::Hf);
    spec.seed = seed;
    spec.dtype = DenseDtype::F32;
    for kv in sets {
        spec.set(kv).expect("override");
    }
    write_random_checkpoint(dir, &spec).expect("random checkpoint");
}

fn requests() -> Vec<(&'static str, Value)> {
    let noul = |text: &str| json!({"type": "noul", "instructions": text, "yes": null, "no": null});
    let many: Vec<Value> = (0..12)
        .map(|i| noul(&format!("Statement {i}: the customer mentions item {i}.")))
        .collect();
    vec![
        (
            "quickstart",
            json!({"state": "My card was charged twice and the app keeps crashing!", "questions": [
                {"type": "choice", "instructions": "Which team should handle this",
                 "options": [{"name": "billing", "description": "Payment or subscription issues"},
                             {"name": "technical", "description": "Bugs, errors"},
                             {"name": "sales", "description": null}]},
                {"type": "score", "instructions": "How frustrated the customer appears",
                 "levels": ["Calm", "Mildly annoyed", "Very frustrated"]},
                {"type": "noul", "instructions": "The message conveys urgency",
                 "yes": "Needs action today", "no": null}], "options": {}}),
        ),
        (
            "ten_levels_and_unicode",
            json!({"state": "{\"note\": \"Zoë a payé deux fois — 重复扣款\"}", "questions": [
                {"type": "score", "instructions": "Severity",
                 "levels": ["0","1","2","3","4","5","6","7","8","9"]},
                {"type": "choice", "instructions": "Langue ?",
                 "options": [{"name": "français", "description": null}, {"name": "中文", "description": "Chinese"}]}],
             "options": {}}),
        ),
        (
            "twelve_questions_indexed",
            json!({"state": "Order 17 arrived late.", "questions": many, "options": {}}),
        ),
        (
            "fixed_draws_and_seed",
            json!({"state": "Refund please", "questions": [noul("Is this a refund request?")],
                   "options": {"seed": 7, "draws": 3}}),
        ),
        (
            "forced_and_read",
            json!({"state": "x", "questions": [
                {"type": "choice", "instructions": "only", "options": [{"name": "one", "description": null}]},
                noul("Is x a letter?")], "options": {}}),
        ),
    ]
}

fn run_reference(python: &Path, ckpt: &Path, request: &Value, scratch: &Path) -> Value {
    let file = scratch.join("request.json");
    std::fs::write(&file, request.to_string()).expect("write request");
    let out = Command::new(python)
        .arg(workspace_root().join("tests/reference/reference_read.py"))
        .args(["--ckpt", &ckpt.display().to_string()])
        .args(["--request", &file.display().to_string()])
        .args(["--dtype", "float32"])
        .output()
        .expect("run the reference");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "reference output is not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn reads_match_the_python_reference_on_unseen_checkpoints() {
    let Some(python) = reference_python() else {
        // The same rule and variable as every test with a prerequisite (hunch_e2e::SKIP_VAR).
        let skip = std::env::var("HUNCH_TEST_SKIP").unwrap_or_default();
        if skip.split(',').any(|n| n.trim() == "reference") {
            eprintln!("SKIPPED on purpose (HUNCH_TEST_SKIP lists reference): no reference venv");
            return;
        }
        panic!(
            "the reference venv (.venv-reference) is missing: run `tests/reference/setup.sh \
             .venv-reference` (or set HUNCH_REFERENCE_PYTHON). To skip the tests that need it on \
             purpose, set HUNCH_TEST_SKIP=reference."
        );
    };
    // The reference runs on the MLX wheel's own BLAS; so do we (docs/mlx-on-linux.md).
    hunch_accelerator::blas::select(hunch_accelerator::blas::BlasChoice::Reference)
        .expect("pin the reference BLAS");
    let scratch = tempfile::tempdir().expect("tempdir");
    // Two shapes the tests have not seen elsewhere: a 2048-vocab model with a 64 canvas, and a
    // small-vocab one with the reference tiny model's canvas of 16 (forces several reads).
    let checkpoints = [
        (101u64, vec!["vocab_size=2048", "top.canvas_length=64"]),
        (
            202u64,
            vec![
                "vocab_size=768",
                "top.canvas_length=16",
                "sliding_window=16",
            ],
        ),
    ];
    let mut worst = 0.0f64;
    for (seed, sets) in &checkpoints {
        let dir = scratch.path().join(format!("ckpt-{seed}"));
        checkpoint(&dir, *seed, sets);
        let mut engine = MlxEngine::load(&dir, &EngineOptions::default()).expect("load");
        for (name, request) in requests() {
            let reference = run_reference(&python, &dir, &request, scratch.path());
            let parsed: ReadRequest = serde_json::from_value(request.clone()).expect("request");
            let ours = engine.read(&parsed);
            if let Some(err) = reference.get("error") {
                let ours = ours.expect_err("reference refused, we answered");
                assert!(
                    matches!(
                        ours,
                        ReadError::InvalidQuestion { .. } | ReadError::TooLarge { .. }
                    ),
                    "{name}: {ours:?} vs {err}"
                );
                continue;
            }
            let ours = ours.unwrap_or_else(|e| panic!("{name} on ckpt {seed}: {e}"));
            let theirs = reference["distributions"]
                .as_array()
                .expect("distributions");
            assert_eq!(ours.distributions.len(), theirs.len(), "{name}");
            for (q, (a, b)) in ours.distributions.iter().zip(theirs).enumerate() {
                let b: Vec<f64> = serde_json::from_value(b.clone()).expect("floats");
                assert_eq!(a.0.len(), b.len(), "{name} q{q}");
                for (x, y) in a.0.iter().zip(&b) {
                    let d = (x - y).abs();
                    worst = worst.max(d);
                    assert!(
                        d <= 1e-3,
                        "{name} ckpt {seed} question {q}: {:?} vs {:?}",
                        a.0,
                        b
                    );
                }
            }
            assert_eq!(
                serde_json::to_value(ours.usage).expect("usage"),
                reference["usage"],
                "{name}: usage"
            );
            // Token-exact prompts, canvases and slots via the planner.
            let plan = engine
                .planner()
                .plan(&parsed.state, &parsed.questions)
                .expect("plan");
            let reads = reference["reads"].as_array().expect("reads");
            assert_eq!(plan.reads.len(), reads.len(), "{name}: read count");
            for (ours, theirs) in plan.reads.iter().zip(reads) {
                assert_eq!(
                    json!(ours.prompt_ids),
                    theirs["prompt_ids"],
                    "{name}: prompt ids"
                );
                assert_eq!(json!(ours.canvas), theirs["canvas"], "{name}: canvas");
                let slots: Vec<Value> = ours
                    .slots
                    .iter()
                    .map(|s| json!([s.position, s.label_ids]))
                    .collect();
                assert_eq!(json!(slots), theirs["slots"], "{name}: slots");
            }
        }
    }
    eprintln!("worst |Δp| against the reference: {worst:.3e}");
}
