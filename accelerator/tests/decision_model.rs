//! llama.cpp's decision models read as llama-server reads them: tiny decision GGUFs of each
//! served type (`tests/data/decision/make_decision_goldens.py` writes them the way llama.cpp's
//! converters do) against llama.cpp's own tokenizer and forward pass on the same files, with
//! llama-server's prompt, label and answer rules (docs/models.md, "Decision models"): the
//! rendered prompts byte for byte, the token and label ids exactly, the answers within the
//! difference the two engines' arithmetic makes.

use std::path::{Path, PathBuf};

use hunch_accelerator::engine::causal::Planner;
use hunch_accelerator::engine::{CausalEngine, CausalEngineOptions};
use hunch_accelerator::server::ReadEngine;
use hunch_core::ReadRequest;
use serde::Deserialize;
use serde_json::Value;

mod common;

/// How far Hunch's label logits may be from llama.cpp's. Both multiply the file's Q8_0
/// weights, but llama.cpp rounds each activation block to 8 bits first and Hunch to 16
/// (docs/logit-read.md, "Kernels"), keeps its K/V cache in float16, and sums in another order:
/// measured on these files, at most 0.049 (0.032 with Hunch's activations at 8 bits too, so
/// most of it is the float16 cache and the order); twice that is allowed.
const LOGIT_TOLERANCE: f32 = 0.1;
/// The same difference in a probability (a softmax moves at most a quarter of its logits'
/// change, divided by the temperature; the smallest here is 0.7).
const PROBABILITY_TOLERANCE: f64 = 0.02;

#[derive(Deserialize)]
struct Goldens {
    files: Vec<GoldenFile>,
}

#[derive(Deserialize)]
struct GoldenFile {
    file: String,
    #[serde(rename = "type")]
    kind: String,
    labels: usize,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    request: ReadRequest,
    questions: Vec<GoldenQuestion>,
}

#[derive(Deserialize)]
struct GoldenQuestion {
    variants: Vec<Variant>,
    distribution: Vec<f64>,
    answer: Value,
}

#[derive(Deserialize)]
struct Variant {
    prompt: String,
    tokens: Vec<u32>,
    labels: Vec<u32>,
    label_logits: Vec<f32>,
}

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/decision")
}

/// Every served type's goldens: `decision-goldens.json`, and nimble's own file (its requests
/// carry the caller's ids and the whole set, `asked`).
fn goldens() -> Goldens {
    let mut files = Vec::new();
    for name in ["decision-goldens.json", "decision-goldens-nimble.json"] {
        let text = std::fs::read_to_string(data().join(name)).expect("goldens");
        let goldens: Goldens = serde_json::from_str(&text).expect("parse goldens");
        files.extend(goldens.files);
    }
    Goldens { files }
}

#[test]
fn decision_models_answer_as_llama_server_does() {
    for golden in goldens().files {
        let path = data().join(&golden.file);
        let mut engine = CausalEngine::load(&path, &CausalEngineOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e}", golden.file));
        let info = engine.info().expect("info");
        let kind = info.kind.expect("kind");
        assert_eq!(kind.read, "decision", "{}", golden.file);
        assert_eq!(kind.family, "decision", "{}", golden.file);
        assert_eq!(kind.decision_type.as_deref(), Some(golden.kind.as_str()));
        assert!(
            info.fingerprint
                .contains(&format!("/decision-v1-{}/", golden.kind)),
            "{}",
            info.fingerprint
        );
        assert_eq!(info.limits.questions.max_choice_options, golden.labels);
        // Only nimble's template reads ids, so only its reads are sent them.
        assert_eq!(
            info.limits.reads_question_ids,
            golden.kind == "nimble",
            "{}",
            golden.file
        );
        for (c, case) in golden.cases.iter().enumerate() {
            let name = format!("{} case {c}", golden.file);
            let Planner::Decision(planner) = engine.planner() else {
                panic!("{} is planned as a chat model", golden.file)
            };
            let plan = engine.planner().plan(&case.request).expect("plan");
            let mut sequences = plan.sequences.iter();
            for (q, question) in case.questions.iter().enumerate() {
                for (v, variant) in question.variants.iter().enumerate() {
                    let prompt = planner.render(&case.request, q, v).expect("render");
                    assert_eq!(prompt, variant.prompt, "{name}: question {q} variant {v}");
                    let sequence = sequences.next().expect("a sequence per variant");
                    assert_eq!(sequence.tokens, variant.tokens, "{name}: q{q} v{v} tokens");
                    assert_eq!(sequence.labels, variant.labels, "{name}: q{q} v{v} labels");
                }
            }
            assert!(sequences.next().is_none(), "{name}: extra sequences");

            let outcome = engine.read(&case.request).expect("read");
            let expected: Vec<(&[f64], &Value)> = case
                .questions
                .iter()
                .map(|q| (q.distribution.as_slice(), &q.answer))
                .collect();
            common::compare_read(
                &name,
                &case.request,
                &outcome.distributions,
                &expected,
                PROBABILITY_TOLERANCE,
            );
            // The label logits themselves, sequence by sequence.
            let hunch_logits = label_logits(&mut engine, &case.request);
            let theirs = case.questions.iter().flat_map(|q| &q.variants);
            let mut worst = 0f32;
            for (ours, variant) in hunch_logits.iter().zip(theirs) {
                for (a, b) in ours.iter().zip(&variant.label_logits) {
                    worst = worst.max((a - b).abs());
                    assert!(
                        (a - b).abs() <= LOGIT_TOLERANCE,
                        "{name}: label logits {ours:?} against llama.cpp's {:?}",
                        variant.label_logits
                    );
                }
            }
            // Shown with --nocapture: the figure docs/models.md quotes.
            eprintln!("{name}: largest label-logit difference from llama.cpp {worst:.5}");
        }
    }
}

/// Every sequence's label logits, as the engine reads them.
fn label_logits(engine: &mut CausalEngine, request: &ReadRequest) -> Vec<Vec<f32>> {
    let plan = engine.planner().plan(request).expect("plan");
    let mut stats = hunch_core::ReadStats::default();
    engine
        .label_logits(&plan.sequences, &mut stats)
        .expect("label logits")
}

/// A nimble read without the caller's ids (a host that predates them) is refused with a 422
/// that names what is missing, never answered from a prompt without them; with them, the
/// question mode changes nothing (one prompt a question, each listing the whole request).
#[test]
fn a_nimble_read_needs_the_ids_and_ignores_the_mode() {
    let golden = goldens()
        .files
        .into_iter()
        .find(|f| f.kind == "nimble")
        .expect("nimble goldens");
    let mut engine =
        CausalEngine::load(&data().join(&golden.file), &CausalEngineOptions::default())
            .expect("load");
    let request = &golden.cases[0].request;
    let without = ReadRequest {
        asked: None,
        ..request.clone()
    };
    let err = engine.read(&without).expect_err("no ids");
    assert_eq!(
        err.kind(),
        hunch_core::ReadErrorKind::InvalidQuestion,
        "{err}"
    );
    assert!(err.to_string().contains("`asked`"), "{err}");
    let joint = engine.read(request).expect("joint");
    let mut isolated = request.clone();
    isolated.options.questions = hunch_core::QuestionMode::Isolated;
    let isolated = engine.read(&isolated).expect("isolated");
    assert_eq!(joint.distributions, isolated.distributions);
}

/// A decision model Hunch cannot serve is refused at load, naming why; never read as a chat
/// model.
#[test]
fn unservable_decision_models_are_refused_by_name() {
    let causal = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/causal/refused");
    for (path, expect) in [
        (
            data().join("tiny-llama.laya.gguf"),
            &["laya", "ModernBERT encoder", "modern-bert", "llama"][..],
        ),
        (
            data().join("tiny-llama.future.gguf"),
            &["unknown decision type \"future-decision\""][..],
        ),
        (
            data().join("tiny-llama.broken-template.gguf"),
            &["systemone template", "a decision model cannot be read"][..],
        ),
        (
            causal.join("tiny-qwen2.decision.gguf"),
            &["no \"systemone\" template"][..],
        ),
    ] {
        let err = CausalEngine::load(&path, &CausalEngineOptions::default())
            .err()
            .unwrap_or_else(|| panic!("{} loaded", path.display()))
            .to_string();
        for e in expect {
            assert!(err.contains(e), "{}: {err:?} lacks {e:?}", path.display());
        }
    }
}
