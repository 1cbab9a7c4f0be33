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
    hunch_accelerator::tools::smollm2_for_tests()
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

fn tiny(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/causal")
        .join(name)
}

/// What `/health` says the model is, from the checkpoint's content: a GGUF's family, layout,
/// the storage of its matrices and its own name; a folder's float dtype or affine codes.
#[test]
fn the_model_says_what_kind_it_is() {
    use hunch_accelerator::server::ReadEngine;
    let kind = |path: PathBuf| {
        let engine = CausalEngine::load(&path, &CausalEngineOptions::default()).expect("loads");
        engine.info().and_then(|i| i.kind).expect("a kind")
    };
    let gguf = kind(tiny("tiny-llama.q4_1.gguf"));
    assert_eq!(
        (
            gguf.family.as_str(),
            gguf.architecture.as_str(),
            gguf.layout.as_str()
        ),
        ("chat", "llama", "gguf")
    );
    assert!(gguf.quantization.starts_with("Q4_1"), "{gguf:?}");
    assert_eq!(gguf.read, "logits-v1");
    let bf16 = kind(tiny("tiny-llama-bf16"));
    assert_eq!(
        (bf16.layout.as_str(), bf16.quantization.as_str()),
        ("hf", "BF16")
    );
    let mlx = kind(tiny("tiny-qwen3-mlx8"));
    assert_eq!(mlx.architecture, "qwen3");
    assert_eq!(mlx.layout, "mlx-affine");
    assert!(mlx.quantization.starts_with("affine-8bit"), "{mlx:?}");
}

/// A chat model without a chat template cannot be read (the v1 prompt is its own template):
/// refused at load, saying so, rather than at every read.
#[test]
fn a_model_without_a_chat_template_is_refused_at_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = tiny("tiny-llama");
    for entry in std::fs::read_dir(&source).expect("read dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).expect("copy");
    }
    let config_path = dir.path().join("tokenizer_config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).expect("read")).expect("json");
    config
        .as_object_mut()
        .expect("an object")
        .remove("chat_template");
    std::fs::write(&config_path, config.to_string()).expect("write");
    let Err(error) = CausalEngine::load(dir.path(), &CausalEngineOptions::default()) else {
        panic!("a model without a chat template loaded");
    };
    let message = error.to_string();
    assert!(message.contains("has no chat template"), "{message}");
}
