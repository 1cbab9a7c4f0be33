//! A Q4_K_M-style GGUF (Q4_K, Q5_K, Q6_K, Q5_0, Q5_1 and Q8_0 matrices, the embedding tied and
//! Q6_K, float32 norms) on the native path: every projection packed for the integer products
//! straight from its blocks, reading within the activations' rounding of the float32 read of
//! the very same dequantised values (an F32 copy of the file), and close to the model as the
//! MLX path loads it (K-quants dequantised to float16).

use std::path::{Path, PathBuf};

use crate::checkpoint::causal::{load_model_for, AffineWeights};
use crate::checkpoint::gguf::quantise::{dequantise, quantise};
use crate::checkpoint::gguf::writer::Writer;
use crate::checkpoint::gguf::{GgmlType, MetaValue};
use crate::model::causal::cpu::kernels::quant::Precision;
use crate::model::causal::{CausalKernels, CausalLm};

const HIDDEN: u64 = 256;
const FFN: u64 = 512;
const HEADS: u64 = 4;
const KV_HEADS: u64 = 2;
const VOCAB: u64 = 320;

/// Normal-ish values of standard deviation about `std` (a sum of four hashed uniforms).
fn values(n: usize, seed: u32, std: f32) -> Vec<f32> {
    let uniform = |i: u32| {
        let h = (i ^ seed.wrapping_mul(0x9E37_79B9)).wrapping_mul(2_654_435_761);
        (h >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    };
    (0..n as u32)
        .map(|i| (0..4).map(|k| uniform(4 * i + k)).sum::<f32>() * std * 1.73)
        .collect()
}

/// The matrices, llama.cpp's names, `(rows, cols)` and their types: Q4_K_M's mix (Q6_K for
/// the embedding, half of attn_v and ffn_down), with Q5_K, Q5_0, Q5_1 and Q8_0 besides.
fn matrices() -> Vec<(String, u64, u64, GgmlType)> {
    let kv = KV_HEADS * HIDDEN / HEADS;
    let mut m = vec![("token_embd.weight".to_owned(), VOCAB, HIDDEN, GgmlType::Q6K)];
    for (i, [v, k, up, down]) in [
        [GgmlType::Q6K, GgmlType::Q4K, GgmlType::Q4K, GgmlType::Q6K],
        [
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q5K,
            GgmlType::Q8_0,
        ],
    ]
    .into_iter()
    .enumerate()
    {
        let p = |n: &str| format!("blk.{i}.{n}.weight");
        m.push((p("attn_q"), HIDDEN, HIDDEN, GgmlType::Q4K));
        m.push((p("attn_k"), kv, HIDDEN, k));
        m.push((p("attn_v"), kv, HIDDEN, v));
        m.push((p("attn_output"), HIDDEN, HIDDEN, GgmlType::Q4K));
        m.push((p("ffn_gate"), FFN, HIDDEN, GgmlType::Q4K));
        m.push((p("ffn_up"), FFN, HIDDEN, up));
        m.push((p("ffn_down"), HIDDEN, FFN, down));
    }
    m
}

/// Writes the model into `dir`: quantised as [`matrices`] says, or (`float`) with every matrix
/// as the float32 values of those same blocks.
fn write(dir: &Path, float: bool) -> PathBuf {
    let u = |v: u64| MetaValue::U32(v as u32);
    let mut w = Writer::new()
        .meta("general.architecture", MetaValue::String("llama".into()))
        .meta("llama.embedding_length", u(HIDDEN))
        .meta("llama.block_count", u(2))
        .meta("llama.feed_forward_length", u(FFN))
        .meta("llama.attention.head_count", u(HEADS))
        .meta("llama.attention.head_count_kv", u(KV_HEADS))
        .meta(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        )
        .meta("llama.rope.freq_base", MetaValue::F32(10_000.0))
        .meta("llama.context_length", u(256));
    for (seed, (name, rows, cols, t)) in matrices().into_iter().enumerate() {
        // The embedding larger, as real ones are beside the projections.
        let std = if name.starts_with("token_embd") {
            0.5
        } else {
            0.06
        };
        let x = values((rows * cols) as usize, seed as u32 + 1, std);
        let blocks = quantise(t, &x).expect("a type written here");
        w = if float {
            let back = dequantise(t, &blocks).expect("dequantises");
            let bytes = back.iter().flat_map(|v| v.to_le_bytes()).collect();
            w.tensor(&name, &[cols, rows], 0, bytes)
        } else {
            w.tensor(&name, &[cols, rows], t.id(), blocks)
        };
    }
    let norm = |n: u64| (0..n).flat_map(|i| (1.0 + 0.01 * (i % 7) as f32).to_le_bytes());
    for i in 0..2 {
        w = w
            .tensor(
                &format!("blk.{i}.attn_norm.weight"),
                &[HIDDEN],
                0,
                norm(HIDDEN).collect(),
            )
            .tensor(
                &format!("blk.{i}.ffn_norm.weight"),
                &[HIDDEN],
                0,
                norm(HIDDEN).collect(),
            );
    }
    w = w.tensor("output_norm.weight", &[HIDDEN], 0, norm(HIDDEN).collect());
    w.write(dir, if float { "f32.gguf" } else { "q4_k_m.gguf" })
}

fn load(path: &Path, kernels: CausalKernels) -> CausalLm {
    let (mut lm, _, _) =
        load_model_for(path, AffineWeights::Auto, kernels, &[]).expect("the model loads");
    lm.select_kernels(kernels).expect("the kernels asked for");
    lm
}

fn relative(a: &[f32], b: &[f32]) -> f32 {
    let max = b.iter().copied().fold(f32::MIN, f32::max);
    let min = b.iter().copied().fold(f32::MAX, f32::min);
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    worst / (max - min).max(1e-3)
}

#[test]
fn a_q4_k_m_gguf_runs_packed_on_the_native_path_within_the_rounding_of_its_float_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let quantised = write(dir.path(), false);
    let float_file = write(dir.path(), true);
    let mut packed = load(&quantised, CausalKernels::Native);
    let float = load(&float_file, CausalKernels::Native);
    let mlx = load(&quantised, CausalKernels::Mlx);
    assert!(
        packed.splits_anywhere(),
        "every projection on the integer products"
    );
    // The loader's packing is the model's one copy: none made beside it.
    assert_eq!(packed.packed_bytes(), 0);
    let tokens: Vec<u32> = (0..29u32).map(|i| (i * 37 + 5) % VOCAB as u32).collect();
    let (_, h32) = float.prefill(&tokens, 8).expect("float");
    let all32 = float.all_logits(&h32).expect("all");
    let labels = [3u32, 17, 42, 100, 255, 319];
    let labels32 = float.label_logits(&h32, &labels).expect("labels");
    // The bounds of the tiny checkpoints' integer products (accelerator/tests/native_kernels.rs).
    for (precision, bound) in [(Precision::Fine, 2e-4), (Precision::Coarse, 3e-2)] {
        packed.set_activation_precision(precision);
        let built = packed.kernels_name();
        assert!(
            built.contains("+int8-") && built.ends_with(precision.name()),
            "{built}"
        );
        let (_, h) = packed.prefill(&tokens, 8).expect("packed");
        let all = packed.all_logits(&h).expect("all");
        let d = relative(&all, &all32);
        let dl = relative(
            &packed.label_logits(&h, &labels).expect("labels"),
            &labels32,
        );
        eprintln!("{precision:?}: relative max |Δ| head {d:.1e}, labels {dl:.1e}");
        assert!(
            d <= bound && dl <= bound,
            "{precision:?}: head {d:.1e}, labels {dl:.1e}"
        );
    }
    let (_, h16) = mlx.prefill(&tokens, 8).expect("mlx");
    let d = relative(&mlx.all_logits(&h16).expect("all"), &all32);
    eprintln!("MLX path (K-quants as float16): relative max |Δ| head {d:.1e}");
    assert!(d <= 1e-2, "the MLX path's float16 weights: {d:.1e}");
}
