//! The chat-model family against an independent reference: mlx-lm in float32 over the same
//! checkpoints, written by `tests/data/causal/make_goldens.py` (Hugging Face folders as
//! transformers writes them, mlx-community quantised folders from `mlx_lm.convert`, GGUF files
//! written by gguf-py in llama.cpp's converter layout). Each case is a token sequence and the
//! last position's logits at six label ids, plus the whole head's argmax and logsumexp.

use std::path::{Path, PathBuf};

use hunch_accelerator::checkpoint::causal::{load_model, AffineWeights, CausalFormat};
use hunch_accelerator::model::causal::{CausalKernels, CausalLm};
use serde::Deserialize;

#[derive(Deserialize)]
struct Goldens {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    model: String,
    tokens: Vec<u32>,
    label_ids: Vec<u32>,
    label_logits: Vec<f32>,
    argmax: usize,
    logsumexp: f64,
}

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/causal")
}

fn goldens() -> Goldens {
    let text = std::fs::read_to_string(data().join("goldens.json")).expect("goldens.json");
    serde_json::from_str(&text).expect("goldens parse")
}

fn model_with(name: &str, affine: AffineWeights, kernels: CausalKernels) -> CausalLm {
    let (mut model, _, _) =
        load_model(&data().join(name), affine).unwrap_or_else(|e| panic!("{name}: {e}"));
    model
        .select_kernels(kernels)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    model
}

/// Quantised weights as stored, on MLX's kernels (the exact affine repacking).
fn model(name: &str) -> CausalLm {
    model_with(name, AffineWeights::Quantized, CausalKernels::Mlx)
}

/// The largest |Δ| a logit may show: float32 sums in another order, and for quantised files
/// MLX's quantized kernels against the reference's dequantised dense products. Measured: at most
/// 4e-6 on every case; a wrong permutation, norm or rope is off by far more than this.
const TOLERANCE: f32 = 5e-5;

/// The same for the native integer products, whose inputs keep ~16 bits per block of 32 (the
/// default `--activation-bits 16`). Measured: at most 3.6e-4 on these cases.
const INT8_TOLERANCE: f32 = 1e-3;

fn family_goldens() -> Goldens {
    let text =
        std::fs::read_to_string(data().join("family-goldens.json")).expect("family-goldens.json");
    serde_json::from_str(&text).expect("family goldens parse")
}

/// Loads `folder` three ways — quantised weights as stored on MLX (the exact affine repacking),
/// widened to float32, and on the native path (the integer products where the weights are
/// quantised, float32 where not) — and compares each with the golden `cases` (those of model
/// `model`), the integer products within their own bound; what disagrees goes to `failures`.
fn compare(folder: &str, model: &str, cases: &[Case], failures: &mut Vec<String>) {
    let runs = [
        (AffineWeights::Quantized, CausalKernels::Mlx),
        (AffineWeights::Dense, CausalKernels::Auto),
        (AffineWeights::Quantized, CausalKernels::Native),
    ];
    for (affine, kernels) in runs {
        let name = folder;
        let (mut lm, _, _) =
            load_model(&data().join(name), affine).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Err(e) = lm.select_kernels(kernels) {
            // bf16 and f16 weights do not run natively (narrow_weights_keep_mlx... in
            // native_kernels.rs says so); every other layout must.
            assert!(e.to_string().contains("float32"), "{name}: {e}");
            continue;
        }
        let integer = lm.kernels_name().contains("int8");
        let tolerance = if integer { INT8_TOLERANCE } else { TOLERANCE };
        for case in cases.iter().filter(|c| c.model == model) {
            let (_, hidden) = lm.prefill(&case.tokens, 32).expect("prefill");
            let logits = lm.label_logits(&hidden, &case.label_ids).expect("labels");
            let worst = logits
                .iter()
                .zip(&case.label_logits)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            let all = lm.all_logits(&hidden).expect("all logits");
            let argmax = all
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i)
                .unwrap_or(0);
            let max = all.iter().copied().fold(f32::MIN, f32::max) as f64;
            let lse = max
                + all
                    .iter()
                    .map(|&v| (v as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            eprintln!(
                "{name} ({affine:?}, {}) len {}: max |Δ| {worst:.2e}, logsumexp Δ {:.2e}",
                lm.kernels_name(),
                case.tokens.len(),
                (lse - case.logsumexp).abs()
            );
            if worst > tolerance
                || argmax != case.argmax
                || (lse - case.logsumexp).abs() > tolerance as f64
            {
                failures.push(format!(
                    "{name} ({affine:?}, {kernels:?}, len {}): labels {logits:?} vs {:?}, argmax {argmax} vs {}, \
                     logsumexp {lse} vs {}",
                    case.tokens.len(),
                    case.label_logits,
                    case.argmax,
                    case.logsumexp
                ));
            }
        }
    }
}

#[test]
fn every_layout_and_architecture_matches_the_reference() {
    let goldens = goldens();
    let mut names: Vec<&str> = goldens.cases.iter().map(|c| c.model.as_str()).collect();
    names.dedup();
    let mut failures = Vec::new();
    for name in names {
        compare(name, name, &goldens.cases, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Qwen2 (q/k/v biases, yarn rope) from its folder and its GGUF, and Mistral (every layer
/// sliding), against a float64 reference of transformers' semantics; and Llama 3's scaled rope
/// as llama.cpp's converter writes it (a `rope_freqs` tensor) against mlx_lm
/// (`make_family_goldens.py`).
#[test]
fn qwen2_mistral_and_llama3_gguf_match_the_reference() {
    let goldens = family_goldens();
    let mut failures = Vec::new();
    for name in [
        "tiny-qwen2",
        "tiny-qwen2.q8_0.gguf",
        "tiny-mistral",
        "tiny-llama3-tied.q8_0.gguf",
    ] {
        assert!(goldens.cases.iter().any(|c| c.model == name), "{name}");
        compare(name, name, &goldens.cases, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The same weights with config.json as transformers 5 saves it (`rope_parameters`,
/// `layer_types`) answer as the older dialect's goldens say: Qwen3's θ of 1e6, Llama 3's rope
/// scaling, Gemma 3's linear scaling of its global layers and Qwen2's yarn come from
/// `rope_parameters` now.
#[test]
fn transformers_5_configs_read_as_their_older_dialect() {
    let mut all = goldens().cases;
    all.extend(family_goldens().cases);
    let mut failures = Vec::new();
    for name in [
        "tiny-qwen3",
        "tiny-llama3-tied",
        "tiny-gemma3",
        "tiny-qwen3-mlx8",
        "tiny-qwen2",
        "tiny-mistral",
    ] {
        let folder = format!("{name}-v5");
        let config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(data().join(&folder).join("config.json")).expect("config"),
        )
        .expect("json");
        assert!(config.get("rope_parameters").is_some() && config.get("rope_theta").is_none());
        assert!(all.iter().any(|c| c.model == name), "{name} has goldens");
        compare(&folder, name, &all, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn formats_are_told_apart_by_content() {
    assert_eq!(
        CausalFormat::detect(&data().join("tiny-llama.q4_1.gguf")),
        Some(CausalFormat::Gguf)
    );
    // The same bytes under another name are still a GGUF.
    let dir = tempfile::tempdir().expect("tempdir");
    let renamed = dir.path().join("weights.bin");
    std::fs::copy(data().join("tiny-llama.q8_0.gguf"), &renamed).expect("copy");
    assert_eq!(CausalFormat::detect(&renamed), Some(CausalFormat::Gguf));
    assert!(matches!(
        CausalFormat::detect(&data().join("tiny-gemma3")),
        Some(CausalFormat::HuggingFace { model_type }) if model_type == "gemma3_text"
    ));
    // A folder of another model type is left to the other families.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).expect("mkdir");
    std::fs::write(
        other.join("config.json"),
        r#"{"model_type": "diffusion_gemma"}"#,
    )
    .expect("write");
    assert_eq!(CausalFormat::detect(&other), None);
}

/// Chunks restored from another prompt give the same bits as computing them again: the unit
/// the engine's prefix cache rests on.
#[test]
fn restored_chunks_give_the_same_bits_as_recomputed_ones() {
    for name in ["tiny-gemma3", "tiny-llama.q4_1.gguf", "tiny-qwen3"] {
        let lm = model(name);
        let shared: Vec<u32> = (0..16).map(|i| (i * 7 + 3) % 300).collect();
        let a: Vec<u32> = shared.iter().copied().chain([5, 6, 7]).collect();
        let b: Vec<u32> = shared.iter().copied().chain([9, 10, 11, 12, 13]).collect();
        let (chunks_a, _) = lm.prefill(&a, 8).expect("prefill a");
        let (_, alone) = lm.prefill(&b, 8).expect("prefill b");
        let restored = chunks_a[..2].to_vec();
        let (_, reused) = lm.forward_chunk(&b[16..], &restored).expect("tail");
        let bits = |a: &mlx_rs::Array| a.as_slice::<f32>().to_vec();
        assert_eq!(bits(&alone), bits(&reused), "{name}");
    }
}

#[test]
fn a_broken_checkpoint_is_refused_naming_what_is_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A GGUF cut short: the header promises tensors past the end.
    let bytes = std::fs::read(data().join("tiny-llama.q8_0.gguf")).expect("read");
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    let err = load_model(&cut, AffineWeights::Auto)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("cut.gguf"), "{err}");
    // A folder whose config disagrees with its tensors.
    let folder = dir.path().join("llama");
    std::fs::create_dir(&folder).expect("mkdir");
    for file in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(data().join("tiny-llama").join(file), folder.join(file)).expect("copy");
    }
    let mut config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(data().join("tiny-llama/config.json")).expect("config"),
    )
    .expect("json");
    config["intermediate_size"] = 256.into();
    std::fs::write(folder.join("config.json"), config.to_string()).expect("write");
    let err = load_model(&folder, AffineWeights::Auto)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("mlp") && err.contains("256"), "{err}");
}

/// The real default model, SmolLM2-135M-Instruct's Q4_1 GGUF (`scripts/fetch-default-model.sh`
/// puts it in the models cache; `HUNCH_SMOLLM2_GGUF` names another copy).
fn smollm2() -> Option<PathBuf> {
    hunch_accelerator::tools::smollm2_for_tests()
}

#[derive(Deserialize)]
struct RealCase {
    tokens: Vec<u32>,
    text: String,
    label_ids: Vec<u32>,
    label_logits: Vec<f32>,
    argmax: usize,
}

#[derive(Deserialize)]
struct RealGoldens {
    cases: Vec<RealCase>,
}

/// SmolLM2's real GGUF: the rendered prompts tokenise to the reference's ids, and the label
/// logits and label probabilities match mlx-lm's float32 read of the dequantised weights.
#[test]
fn smollm2_matches_the_reference_on_real_prompts() {
    let Some(path) = smollm2() else { return };
    let (model, _, _) = load_model(&path, AffineWeights::Auto).expect("SmolLM2 loads");
    let file = hunch_accelerator::checkpoint::gguf::GgufFile::open(&path).expect("open");
    let tokenizer =
        hunch_accelerator::tokenizer::chat::ChatTokenizer::from_gguf(&file).expect("tokenizer");
    let text = std::fs::read_to_string(data().join("smollm2-goldens.json")).expect("goldens");
    let goldens: RealGoldens = serde_json::from_str(&text).expect("parse");
    for case in &goldens.cases {
        let ids = tokenizer.encode(&case.text).expect("encode");
        assert_eq!(ids, case.tokens, "token ids of {:?}", case.text);
        let (_, hidden) = model.prefill(&case.tokens, 32).expect("prefill");
        let logits = model
            .label_logits(&hidden, &case.label_ids)
            .expect("labels");
        let softmax = |v: &[f32]| -> Vec<f64> {
            let max = v.iter().copied().fold(f32::MIN, f32::max) as f64;
            let e: Vec<f64> = v.iter().map(|&x| (x as f64 - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            e.iter().map(|x| x / sum).collect()
        };
        let (ours, reference) = (softmax(&logits), softmax(&case.label_logits));
        let worst = ours
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        eprintln!("smollm2 len {}: max |Δp| {worst:.2e}", case.tokens.len());
        assert!(worst < 2e-3, "probabilities {ours:?} vs {reference:?}");
        let all = model.all_logits(&hidden).expect("all");
        let argmax = all
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i);
        assert_eq!(argmax, case.argmax);
    }
}

/// GGUF metadata is audited as config.json is: a key the architecture does not have and a rope
/// type Hunch does not implement are each refused by name (`make_family_goldens.py` writes the
/// files; a llama.cpp decision model is read by its own prompt or refused by name:
/// tests/decision_model.rs).
#[test]
fn gguf_metadata_that_would_change_the_math_is_refused_by_name() {
    for (file, expect) in [
        (
            "tiny-qwen2.unknown-key.gguf",
            &["qwen2.attention.zoom", "ignore_config_keys"][..],
        ),
        (
            "tiny-qwen2.longrope.gguf",
            &["qwen2.rope.scaling.type", "longrope"][..],
        ),
    ] {
        let path = data().join("refused").join(file);
        let err = load_model(&path, AffineWeights::Auto)
            .err()
            .unwrap_or_else(|| panic!("{file} loaded"))
            .to_string();
        for e in expect {
            assert!(err.contains(e), "{file}: {err:?} lacks {e:?}");
        }
    }
}

/// A folder whose model type is not served is refused by that name, not handed to the
/// DiffusionGemma loader.
#[test]
fn an_unserved_model_type_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path().join("moe");
    std::fs::create_dir(&folder).expect("mkdir");
    let mut config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(data().join("tiny-qwen2/config.json")).expect("config"),
    )
    .expect("json");
    config["model_type"] = serde_json::json!("qwen2_moe");
    std::fs::write(folder.join("config.json"), config.to_string()).expect("write");
    assert!(matches!(
        CausalFormat::detect(&folder),
        Some(CausalFormat::HuggingFace { model_type }) if model_type == "qwen2_moe"
    ));
    let err = load_model(&folder, AffineWeights::Auto)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("qwen2_moe") && err.contains("not a family Hunch serves"),
        "{err}"
    );
}

/// The same model as a Hugging Face folder and as the GGUF llama.cpp's converter makes of it
/// reads to the same configuration, field by field; the rope is compared by the frequencies it
/// means (a llama3 adjustment arrives in a GGUF as llama.cpp's `rope_freqs` factors).
#[test]
fn a_folder_and_its_gguf_read_to_the_same_configuration() {
    for (folder, file) in [
        ("tiny-llama", "tiny-llama.f32.gguf"),
        ("tiny-llama3-tied", "tiny-llama3-tied.q8_0.gguf"),
        ("tiny-qwen2", "tiny-qwen2.q8_0.gguf"),
        ("tiny-qwen3", "tiny-qwen3.q8_0.gguf"),
        ("tiny-gemma3", "tiny-gemma3.f16.gguf"),
    ] {
        let hf = model(folder).config().clone();
        let gguf = model(file).config().clone();
        let d = hf.head_dim;
        for (a, b, what) in [
            (&hf.rope, &gguf.rope, "full layers"),
            (&hf.rope_local, &gguf.rope_local, "sliding layers"),
        ] {
            assert_eq!(a.theta, b.theta, "{folder} {what}");
            assert_eq!(a.position_scale(), b.position_scale(), "{folder} {what}");
            assert_eq!(
                a.attention_factor(),
                b.attention_factor(),
                "{folder} {what}"
            );
            let (pa, pb) = (a.periods(d), b.periods(d));
            match (pa, pb) {
                (None, None) => {}
                (Some(pa), Some(pb)) => {
                    for (x, y) in pa.iter().zip(&pb) {
                        assert!(
                            (x / y - 1.0).abs() < 1e-5,
                            "{folder} {what}: {pa:?} vs {pb:?}"
                        );
                    }
                }
                other => panic!("{folder} {what}: {other:?}"),
            }
        }
        let strip = |mut c: hunch_accelerator::model::causal::CausalConfig| {
            c.rope = hunch_accelerator::model::causal::RopeSpec::plain(1.0);
            c.rope_local = c.rope.clone();
            c
        };
        assert_eq!(strip(hf), strip(gguf), "{folder} and {file}");
    }
}
