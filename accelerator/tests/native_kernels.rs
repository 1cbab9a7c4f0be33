//! The native CPU forward of chat models' prompt chunks (`model::causal::cpu`) against the MLX
//! path on every tiny test checkpoint: the same label logits, whole head and last hidden state
//! within float32 rounding, over prompts of several chunks (chunks of 8, so Gemma 3's sliding
//! window of 8 cuts across chunks); restored chunks giving the same bits as recomputed ones,
//! through the model and through the engine's prefix cache; and the choice itself (`auto`
//! takes the native path for float32, narrow and, with a SIMD copy of the integer products,
//! quantised weights); and every copy of the integer products giving the same bits.

use std::path::{Path, PathBuf};

use hunch_accelerator::checkpoint::causal::{load_model, AffineWeights};
use hunch_accelerator::engine::{CausalEngine, CausalEngineOptions};
use hunch_accelerator::model::causal::cpu::kernels::quant::Precision;
use hunch_accelerator::model::causal::{CausalChunk, CausalKernels, CausalLm};
use hunch_core::{ChoiceOption, Question, QuestionKind, QuestionMode, ReadOptions, ReadRequest};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/causal")
}

/// Every tiny checkpoint whose weights load as dense float32 (affine ones widened at load); the
/// quantised layouts last ([`QUANTISED`]).
const DENSE: [&str; 14] = [
    // bf16 and f16 weights, widened once for the native path.
    "tiny-llama-bf16",
    "tiny-llama.f16.gguf",
    "tiny-gemma3.f16.gguf",
    "tiny-llama",
    "tiny-llama3-tied",
    "tiny-qwen3",
    "tiny-gemma3",
    "tiny-llama.f32.gguf",
    "tiny-llama.q4_0.gguf",
    "tiny-llama.q4_1.gguf",
    "tiny-llama.q8_0.gguf",
    "tiny-gemma3.q4_0.gguf",
    "tiny-qwen3.q8_0.gguf",
    "tiny-llama-mlx4",
];

fn load(name: &str, kernels: CausalKernels) -> CausalLm {
    load_as(name, AffineWeights::Dense, kernels)
}

fn load_as(name: &str, affine: AffineWeights, kernels: CausalKernels) -> CausalLm {
    let (mut lm, _, _) =
        load_model(&data().join(name), affine).unwrap_or_else(|e| panic!("{name}: {e}"));
    let chosen = lm
        .select_kernels(kernels)
        .unwrap_or_else(|e| panic!("{name}: {kernels}: {e}"));
    assert_ne!(chosen, CausalKernels::Auto);
    lm
}

/// A prompt of `len` ids inside the tiny vocabularies (320).
fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 37 + seed * 11 + 5) % 320)
        .collect()
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}

fn range(v: &[f32]) -> f32 {
    let max = v.iter().copied().fold(f32::MIN, f32::max);
    let min = v.iter().copied().fold(f32::MAX, f32::min);
    (max - min).max(1e-3)
}

#[test]
fn native_chunks_match_mlx_on_every_tiny_checkpoint() {
    let mut failures = Vec::new();
    for name in DENSE {
        let native = load(name, CausalKernels::Auto);
        assert_eq!(
            native.kernels(),
            CausalKernels::Native,
            "{name}: auto picks the native path on the CPU for dense float32 weights"
        );
        let mlx = load(name, CausalKernels::Mlx);
        // 5 chunks of 8 and a partial one; a prompt that ends inside the first chunk.
        for (len, chunk) in [(43usize, 8usize), (5, 8), (37, 16)] {
            let tokens = prompt(len, len as u32);
            let (native_chunks, native_hidden) = native.prefill(&tokens, chunk).expect("native");
            let (mlx_chunks, mlx_hidden) = mlx.prefill(&tokens, chunk).expect("mlx");
            let hidden = (
                native_hidden.as_slice::<f32>().to_vec(),
                mlx_hidden.as_slice::<f32>().to_vec(),
            );
            let labels = [3u32, 17, 42, 100, 255, 319];
            let native_labels = native
                .label_logits(&native_hidden, &labels)
                .expect("labels");
            let mlx_labels = mlx.label_logits(&mlx_hidden, &labels).expect("labels");
            let native_all = native.all_logits(&native_hidden).expect("all");
            let mlx_all = mlx.all_logits(&mlx_hidden).expect("all");
            let logit_range = range(&mlx_all);
            let (dh, dl, da) = (
                worst(&hidden.0, &hidden.1) / range(&hidden.1),
                worst(&native_labels, &mlx_labels) / logit_range,
                worst(&native_all, &mlx_all) / logit_range,
            );
            // Every layer's K/V of every chunk, against the MLX path's.
            let mut dkv = 0.0f32;
            for (a, b) in native_chunks.iter().zip(&mlx_chunks) {
                for (x, y) in a.kv.iter().zip(&b.kv) {
                    assert_eq!(x.keys.shape(), y.keys.shape(), "{name}: K/V shapes");
                    let contiguous = |t: &mlx_rs::Array| {
                        t.contiguous()
                            .expect("contiguous")
                            .as_slice::<f32>()
                            .to_vec()
                    };
                    for (p, q) in [(&x.keys, &y.keys), (&x.values, &y.values)] {
                        let (p, q) = (contiguous(p), contiguous(q));
                        dkv = dkv.max(worst(&p, &q) / range(&q));
                    }
                }
            }
            eprintln!(
                "{name} len {len} chunk {chunk}: relative max |Δ| hidden {dh:.1e}, labels \
                 {dl:.1e}, head {da:.1e}, K/V {dkv:.1e}"
            );
            if dh > 1e-5 || dl > 1e-5 || da > 1e-5 || dkv > 1e-5 {
                failures.push(format!("{name} len {len} chunk {chunk}"));
            }
        }
    }
    assert!(failures.is_empty(), "native differs from MLX: {failures:?}");
}

/// The tiny checkpoints whose projections are affine-quantised (GGUF Q4_0/Q4_1/Q8_0, MLX 4-bit):
/// the last six of [`DENSE`] (which widens them).
const QUANTISED: &[&str] = DENSE.split_at(8).1;

/// Quantised weights kept as stored run on the native integer products: within the inputs'
/// rounding of the float32 read of the same weights, at both widths.
#[test]
fn integer_products_match_the_float_read_within_the_activations_rounding() {
    let mut failures = Vec::new();
    for name in QUANTISED {
        let mut int8 = load_as(name, AffineWeights::Quantized, CausalKernels::Native);
        let float = load(name, CausalKernels::Native);
        for (precision, bound) in [
            (Precision::Fine, FINE_RELATIVE),
            (Precision::Coarse, COARSE_RELATIVE),
        ] {
            int8.set_activation_precision(precision);
            let built = int8.kernels_name();
            assert!(
                built.contains("+int8-") && built.ends_with(precision.name()),
                "{built}"
            );
            for (len, chunk) in [(43usize, 8usize), (37, 16)] {
                let tokens = prompt(len, len as u32);
                let (_, h8) = int8.prefill(&tokens, chunk).expect("int8");
                let (_, h32) = float.prefill(&tokens, chunk).expect("float");
                let all8 = int8.all_logits(&h8).expect("all");
                let all32 = float.all_logits(&h32).expect("all");
                let d = worst(&all8, &all32) / range(&all32);
                eprintln!("{name} len {len} {precision:?}: relative max |Δ| head {d:.1e}");
                if d > bound {
                    failures.push(format!("{name} len {len} {precision:?}: {d:.1e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "integer products off: {failures:?}");
}

/// The bounds of the test above, relative to the head's range. Measured on these checkpoints:
/// at most 5.9e-5 with 16-bit inputs, 1.0e-2 with 8-bit ones; a wrong code, scale or
/// bias is off by a large fraction of the range.
const FINE_RELATIVE: f32 = 2e-4;
const COARSE_RELATIVE: f32 = 3e-2;

/// A chunk's K/V and the hidden state after it are the same bits whether the chunks before it
/// were computed just now or restored from another prompt (docs/logit-read.md, "Exactness").
#[test]
fn restored_chunks_give_the_same_bits_on_the_native_path() {
    for (name, affine) in [
        ("tiny-gemma3", AffineWeights::Dense),
        ("tiny-llama.q4_1.gguf", AffineWeights::Dense),
        ("tiny-qwen3", AffineWeights::Dense),
        ("tiny-llama3-tied", AffineWeights::Dense),
        // The integer products.
        ("tiny-llama.q4_1.gguf", AffineWeights::Quantized),
        ("tiny-gemma3.q4_0.gguf", AffineWeights::Quantized),
    ] {
        let lm = load_as(name, affine, CausalKernels::Native);
        let shared = prompt(24, 1);
        let a: Vec<u32> = shared.iter().copied().chain([5, 6, 7]).collect();
        let b: Vec<u32> = shared.iter().copied().chain([9, 10, 11, 12, 13]).collect();
        let (chunks_a, _) = lm.prefill(&a, 8).expect("prefill a");
        let (chunks_b, alone) = lm.prefill(&b, 8).expect("prefill b");
        let restored = chunks_a[..3].to_vec();
        let (tail, reused) = lm.forward_chunk(&b[24..], &restored).expect("tail");
        let bits = |a: &mlx_rs::Array| a.as_slice::<f32>().to_vec();
        assert_eq!(bits(&alone), bits(&reused), "{name}: hidden state");
        for (x, y) in tail.kv.iter().zip(&chunks_b[3].kv) {
            assert_eq!(bits(&x.keys), bits(&y.keys), "{name}: keys");
            assert_eq!(bits(&x.values), bits(&y.values), "{name}: values");
        }
        // The shared chunks themselves are the same bits in both prompts.
        for (x, y) in chunks_a[..3].iter().zip(&chunks_b[..3]) {
            for (p, q) in x.kv.iter().zip(&y.kv) {
                assert_eq!(bits(&p.keys), bits(&q.keys), "{name}: shared keys");
            }
        }
    }
}

/// With every projection on the integer products, a position's K/V and hidden state are the
/// same bits wherever the prompt before it was split: a prefix computed to a point that is not
/// a chunk bound (where two prompts stop sharing tokens) serves another prompt exactly.
#[test]
fn prompts_split_anywhere_on_the_integer_products_give_the_same_bits() {
    for name in ["tiny-llama.q4_1.gguf", "tiny-gemma3.q4_0.gguf"] {
        let lm = load_as(name, AffineWeights::Quantized, CausalKernels::Native);
        if !lm.splits_anywhere() {
            // No SIMD integer products here: they run only when forced, as in
            // `restored_chunks_give_the_same_bits_on_the_native_path`.
            assert!(!hunch_accelerator::model::causal::cpu::kernels::quant::fast());
            continue;
        }
        let b: Vec<u32> = prompt(21, 1)
            .into_iter()
            .chain([9, 10, 11, 12, 13])
            .collect();
        let (_, whole) = lm.prefill(&b, 8).expect("prefill b in chunks of 8");
        // The first 21 tokens as 8 + 8 + 5, then the rest in one chunk of 5.
        let mut past = Vec::new();
        for (from, to) in [(0, 8), (8, 16), (16, 21)] {
            let (chunk, _) = lm.forward_chunk(&b[from..to], &past).expect("chunk");
            past.push(chunk);
        }
        let (_, split) = lm.forward_chunk(&b[21..], &past).expect("tail");
        let bits = |a: &mlx_rs::Array| a.as_slice::<f32>().to_vec();
        assert_eq!(bits(&whole), bits(&split), "{name}: hidden state");
    }
    // Dense float32 products keep the split at whole chunks.
    let dense = load_as("tiny-llama", AffineWeights::Dense, CausalKernels::Native);
    assert!(!dense.splits_anywhere());
}

/// Chunks of different prompts at different positions through one batched pass get the very
/// bits each gets alone, wherever every projection runs on the integer products.
#[test]
fn batched_chunks_get_the_bits_each_gets_alone_on_the_integer_products() {
    for name in ["tiny-llama.q4_1.gguf", "tiny-gemma3.q4_0.gguf"] {
        let lm = load_as(name, AffineWeights::Quantized, CausalKernels::Native);
        if !lm.splits_anywhere() {
            continue;
        }
        let shared = prompt(13, 1);
        let (past, _) = lm.prefill(&shared, 8).expect("prefill");
        let (a, b) = (prompt(9, 2), prompt(5, 3));
        let items: [(&[u32], &[CausalChunk]); 3] =
            [(&a, &past), (&b, &past[..1]), (&shared[..6], &[])];
        let batched = lm.forward_batch(&items).expect("batch");
        let bits = |a: &mlx_rs::Array| a.as_slice::<f32>().to_vec();
        for ((tokens, past), (chunk, hidden)) in items.iter().zip(&batched) {
            let (alone, alone_hidden) = lm.forward_chunk(tokens, past).expect("alone");
            assert_eq!(bits(hidden), bits(&alone_hidden), "{name}: hidden state");
            for (x, y) in chunk.kv.iter().zip(&alone.kv) {
                assert_eq!(bits(&x.keys), bits(&y.keys), "{name}: keys");
                assert_eq!(bits(&x.values), bits(&y.values), "{name}: values");
            }
        }
    }
}

/// Narrow float weights run natively under `auto` (widened once), quantised ones kept as stored
/// natively where the CPU has the integer products and on MLX where not.
#[test]
fn auto_takes_the_native_path_for_narrow_and_quantised_weights() {
    for name in [
        "tiny-llama-bf16",
        "tiny-llama.f16.gguf",
        "tiny-gemma3.f16.gguf",
    ] {
        let (lm, _, _) = load_model(&data().join(name), AffineWeights::Auto).expect("loads");
        assert_eq!(lm.kernels(), CausalKernels::Native, "{name}");
        assert!(lm.packed_bytes() > 0, "{name}: widened copies are counted");
    }
    let (lm, _, _) = load_model(
        &data().join("tiny-llama.q8_0.gguf"),
        AffineWeights::Quantized,
    )
    .expect("loads");
    let expected = if hunch_accelerator::model::causal::cpu::kernels::quant::fast() {
        CausalKernels::Native
    } else {
        CausalKernels::Mlx
    };
    assert_eq!(lm.kernels(), expected);
    assert_eq!(
        "native".parse::<CausalKernels>().ok(),
        Some(CausalKernels::Native)
    );
    assert!("fast".parse::<CausalKernels>().is_err());
}

fn request(state: &str) -> ReadRequest {
    let option = |name: &str| ChoiceOption {
        name: name.into(),
        description: None,
    };
    ReadRequest {
        state: state.into(),
        questions: vec![
            Question {
                instructions: "Is this about billing?".into(),
                kind: QuestionKind::Noul {
                    yes: None,
                    no: None,
                },
            },
            Question {
                instructions: "Which team?".into(),
                kind: QuestionKind::Choice {
                    options: vec![option("billing"), option("technical"), option("sales")],
                },
            },
        ],
        options: ReadOptions {
            questions: QuestionMode::Isolated,
            ..ReadOptions::default()
        },
        asked: None,
    }
}

/// Through the engine (chunks of 11, prefix cache on): a request read after another that shares
/// its prompt's start answers the same bits as read alone, and the fingerprint names the
/// kernels.
#[test]
fn the_engine_answers_the_same_bits_from_its_cache_on_the_native_path() {
    use hunch_accelerator::server::ReadEngine;
    for (name, affine) in [
        ("tiny-llama", AffineWeights::Dense),
        ("tiny-gemma3", AffineWeights::Dense),
        ("tiny-qwen3.q8_0.gguf", AffineWeights::Dense),
        ("tiny-qwen3.q8_0.gguf", AffineWeights::Quantized),
    ] {
        let path = data().join(name);
        let options = CausalEngineOptions {
            prefill_chunk: 11,
            affine,
            kernels: CausalKernels::Native,
            ..CausalEngineOptions::default()
        };
        let first = request("A customer was charged twice for one order and wants a refund.");
        let second = request("A customer was charged twice for one order and asks why.");
        let mut warm = CausalEngine::load(&path, &options).expect("loads");
        warm.read(&first).expect("first");
        let after = warm.read(&second).expect("second");
        assert!(
            after.stats.reused_tokens > 0,
            "{name}: the prefix was restored"
        );
        let mut cold = CausalEngine::load(&path, &options).expect("loads");
        let alone = cold.read(&second).expect("alone");
        if warm.model().splits_anywhere() {
            // Read alone, the second question restores the first's prefix to the exact token
            // where their prompts part (not a multiple of the chunk of 11).
            let plan = cold.planner().plan(&second).expect("plan");
            let (p, q) = (&plan.sequences[0].tokens, &plan.sequences[1].tokens);
            let common = p.iter().zip(q).take_while(|(a, b)| a == b).count();
            assert_eq!(alone.stats.reused_tokens, common as u64, "{name}");
            assert!(
                common % 11 != 0,
                "{name}: the test needs a prefix off the chunk bounds ({common} tokens)"
            );
            // After the first request, the second's first question restores to the exact
            // token where its prompt parts from the first's (part of a cached chunk), as
            // llama.cpp reuses its cache's common prefix.
            let earlier = cold.planner().plan(&first).expect("plan");
            let across = earlier.sequences[0]
                .tokens
                .iter()
                .zip(p)
                .take_while(|(a, b)| a == b)
                .count();
            assert!(
                across % 11 != 0 && after.stats.reused_tokens >= across as u64,
                "{name}: {} reused, {across} shared with the earlier request",
                after.stats.reused_tokens
            );
        }
        assert_eq!(
            format!("{:?}", after.distributions),
            format!("{:?}", alone.distributions),
            "{name}"
        );
        let fingerprint = warm.info().expect("info").fingerprint;
        assert!(fingerprint.contains("/native-"), "{fingerprint}");
        let mlx = CausalEngine::load(
            &path,
            &CausalEngineOptions {
                kernels: CausalKernels::Mlx,
                ..options.clone()
            },
        )
        .expect("loads");
        assert!(mlx.info().expect("info").fingerprint.contains("/mlx/"));
    }
}

/// Set in the child processes of [`every_integer_copy_gives_the_same_bits_through_the_model`].
const CHILD: &str = "HUNCH_TEST_ISA_CHILD";

/// The integer products' copy is chosen once per process (`HUNCH_CPU_ISA`, read once), so each
/// copy this CPU runs reads a quantised checkpoint in a child process of this test binary,
/// capped to that copy: the model's kernels name the copy, and every SIMD copy gives the same
/// bits of the whole head (`portable` also keeps the float kernels portable, whose last bits
/// differ, so it is only checked to name itself).
#[test]
fn every_integer_copy_gives_the_same_bits_through_the_model() {
    use hunch_accelerator::model::causal::cpu::kernels::quant;
    if std::env::var_os(CHILD).is_some() {
        let lm = load_as(
            "tiny-llama.q8_0.gguf",
            AffineWeights::Quantized,
            CausalKernels::Native,
        );
        let (_, hidden) = lm.prefill(&prompt(29, 3), 8).expect("prefill");
        let logits = lm.all_logits(&hidden).expect("logits");
        let digest = logits.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            (h ^ v.to_bits() as u64).wrapping_mul(0x100_0000_01b3)
        });
        println!("isa-child {} {digest:016x}", lm.kernels_name());
        return;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let mut digests = Vec::new();
    for isa in quant::available() {
        let run = std::process::Command::new(&exe)
            .args([
                "every_integer_copy_gives_the_same_bits_through_the_model",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env(quant::ISA_VARIABLE, isa.flag())
            .output()
            .expect("runs the test binary");
        let out = String::from_utf8_lossy(&run.stdout);
        assert!(
            run.status.success(),
            "{isa}: {out}{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let line = out
            .lines()
            // The harness prints the test's name on the same line.
            .find_map(|l| l.split_once("isa-child ").map(|(_, rest)| rest))
            .unwrap_or_else(|| panic!("{isa}: no result in {out}"));
        let (name, digest) = line.split_once(' ').expect("name and digest");
        assert!(name.contains(&format!("+{}-", isa.name())), "{isa}: {name}");
        eprintln!("{isa}: {name} {digest}");
        if *isa == quant::QuantIsa::Portable {
            assert!(name.starts_with("native-portable+"), "{name}");
        } else {
            digests.push((*isa, digest.to_owned()));
        }
    }
    assert!(
        digests.windows(2).all(|w| w[0].1 == w[1].1),
        "copies disagree: {digests:?}"
    );
}
