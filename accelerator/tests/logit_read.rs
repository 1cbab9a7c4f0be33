//! The label-logit read against an independent implementation of simple-jev's prompt structure
//! v1 (`tests/data/causal/v1_reference.py`, written from the published spec, which reproduces
//! the spec's worked example byte for byte): the system and user messages and prefill of every
//! question, and on SmolLM2's real GGUF the rendered token ids, the label ids and the answers
//! (mlx-lm float32 on the dequantised weights).

use std::path::{Path, PathBuf};

use hunch_accelerator::engine::{CausalEngine, CausalEngineOptions};
use hunch_accelerator::read::logits::v1_messages;
use hunch_core::ReadRequest;
use serde::Deserialize;

#[derive(Deserialize)]
struct Goldens {
    requests: Vec<GoldenRequest>,
}

#[derive(Deserialize)]
struct GoldenRequest {
    request: ReadRequest,
    questions: Vec<GoldenQuestion>,
}

#[derive(Deserialize)]
struct GoldenQuestion {
    index: usize,
    system: String,
    user: String,
    prefill: String,
    smollm2: Option<RealRead>,
}

#[derive(Deserialize)]
struct RealRead {
    tokens: Vec<u32>,
    label_ids: Vec<u32>,
    label_probs: Vec<f64>,
    answer: serde_json::Value,
}

fn goldens() -> Goldens {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/causal/read-goldens.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("read-goldens.json")).expect("parse")
}

#[test]
fn v1_messages_match_the_independent_reference() {
    for golden in goldens().requests {
        let messages = v1_messages(&golden.request);
        for q in &golden.questions {
            let (system, user, prefill) = &messages[q.index];
            assert_eq!(system, &q.system, "system message of question {}", q.index);
            assert_eq!(user, &q.user, "user message of question {}", q.index);
            assert_eq!(*prefill, q.prefill, "prefill of question {}", q.index);
        }
    }
}

fn smollm2() -> Option<PathBuf> {
    let path = std::env::var_os("HUNCH_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HUNCH_MODELS_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/hunch/models"))
                })
                .map(|c| c.join("SmolLM2-135M-Instruct.Q4_1.gguf"))
        })?;
    if path.is_file() {
        return Some(path);
    }
    let skip = std::env::var("HUNCH_TEST_SKIP").unwrap_or_default();
    assert!(
        skip.split(',').any(|s| s.trim() == "smollm2"),
        "{} is missing: run scripts/fetch-default-model.sh (or HUNCH_TEST_SKIP=smollm2)",
        path.display()
    );
    None
}

#[test]
fn smollm2_reads_the_reference_tokens_and_answers() {
    let Some(path) = smollm2() else { return };
    let mut engine = CausalEngine::load(&path, &CausalEngineOptions::default()).expect("loads");
    for golden in goldens().requests {
        let plan = engine.planner().plan(&golden.request).expect("plan");
        let outcome = engine.read(&golden.request).expect("read");
        for q in &golden.questions {
            let Some(real) = &q.smollm2 else { continue };
            let sequence = &plan.sequences[q.index];
            assert_eq!(
                sequence.tokens, real.tokens,
                "rendered token ids of question {}",
                q.index
            );
            assert_eq!(
                sequence.labels, real.label_ids,
                "label ids of question {}",
                q.index
            );
            let distribution = &outcome.distributions[q.index];
            let ours = distribution.probabilities();
            match real.answer.get("p_true").and_then(|p| p.as_f64()) {
                // Noul: the distribution is [p(true), p(false)] from v1's rating formula.
                Some(p_true) => assert!(
                    (ours[0] - p_true).abs() < 2e-3,
                    "question {}: p(true) {} vs {p_true}",
                    q.index,
                    ours[0]
                ),
                None => {
                    assert_eq!(ours.len(), real.label_probs.len());
                    for (a, b) in ours.iter().zip(&real.label_probs) {
                        assert!(
                            (a - b).abs() < 2e-3,
                            "question {}: {ours:?} vs {:?}",
                            q.index,
                            real.label_probs
                        );
                    }
                }
            }
        }
    }
}
