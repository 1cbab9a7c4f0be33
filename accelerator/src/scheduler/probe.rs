//! The batch-invariance probe: how far a read's probabilities move when its work shares forward
//! passes with another read's, measured on the loaded model and backend at start-up.
//!
//! The batched forward is built so that the answer to this is exactly 0 wherever the matmuls are
//! row-independent (MLX's CPU backend with its bundled reference BLAS). Some backends choose
//! their kernels by matrix shape (OpenBLAS's small-matrix paths, cuBLAS's split-K), and then a
//! row's sum order — and its last bits — can depend on how many rows share the matmul. Rather
//! than assume either, the engine measures it once and reports the figure with every answer that
//! was computed in a shared forward (the `x-hunch-batch-deviation` header).

use crate::model::{CanvasBatch, ChunkKv, DiffusionGemma, ModelError, PromptChunk};

/// Deterministic token ids in `[1, vocab)` (a fixed LCG: the probe must be the same every run).
fn probe_ids(seed: u64, count: usize, vocab: u32) -> Vec<u32> {
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            1 + ((state >> 33) % (vocab.max(2) as u64 - 1)) as u32
        })
        .collect()
}

/// Tokens of a slot whose pairs stand in for a question's labels.
const LABEL_CANDIDATES: usize = 32;

/// The largest change, between two logits rows of one slot, in the answer of a two-label
/// question over any pair of the `LABEL_CANDIDATES` tokens the first row ranks highest:
/// `|σ(a − b) − σ(a' − b')|`. Answers are softmaxes over a handful of labels, so this is the
/// scale a client sees; a full-vocabulary |Δp| would hide the same logit change behind the
/// tiny probabilities of a 262k vocabulary (on an H200 in float32 it read 2.6e-3 while answers
/// moved by 0.16).
fn label_deviation(alone: &[f32], batched: &[f32]) -> f64 {
    let mut order: Vec<usize> = (0..alone.len()).collect();
    order.sort_by(|&i, &j| alone[j].total_cmp(&alone[i]));
    order.truncate(LABEL_CANDIDATES);
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    let mut worst = 0.0f64;
    for (k, &i) in order.iter().enumerate() {
        for &j in &order[k + 1..] {
            let p = sigmoid(alone[i] as f64 - alone[j] as f64);
            let q = sigmoid(batched[i] as f64 - batched[j] as f64);
            worst = worst.max((p - q).abs());
        }
    }
    worst
}

/// The largest |Δp| of a two-label answer at the read's slots (see [`label_deviation`]) between a
/// read run alone and the same read whose prompt chunks and decoder pass each share a forward with another
/// read's work (a different prompt, another canvas width, and prefill rows mixed with decoder
/// rows).
pub fn measure_batch_deviation(model: &DiffusionGemma, chunk: usize) -> Result<f64, ModelError> {
    let chunk = chunk.max(1);
    let vocab = model.config().vocab_size as u32;
    let prompt_a = probe_ids(1, chunk + chunk / 2 + 3, vocab);
    let prompt_b = probe_ids(2, 2 * chunk + 5, vocab);
    let canvases_a = vec![probe_ids(3, 16, vocab), probe_ids(4, 16, vocab)];
    let canvases_b = vec![
        probe_ids(5, 24, vocab),
        probe_ids(6, 24, vocab),
        probe_ids(7, 24, vocab),
    ];
    let positions_a = [0usize, 5, 15];
    let positions_b = [1usize, 23];

    // Alone: A's chunks one per forward, then A's decoder pass on its own.
    let alone_cache = model.prompt_cache(&model.prefill_chunks(&prompt_a, chunk)?)?;
    let alone = model.forward(
        &[],
        &[CanvasBatch {
            cache: &alone_cache,
            canvases: &canvases_a,
            positions: Some(&positions_a),
            self_conditioning: None,
            labels: None,
        }],
    )?;
    let alone = alone.logits(0)?.to_vec();

    // Batched: A's and B's chunks share forwards; then A's decoder pass shares one with B's
    // decoder pass and a prompt chunk of a third read.
    let (mut a, mut b): (Vec<ChunkKv>, Vec<ChunkKv>) = (Vec::new(), Vec::new());
    let (pieces_a, pieces_b): (Vec<&[u32]>, Vec<&[u32]>) = (
        prompt_a.chunks(chunk).collect(),
        prompt_b.chunks(chunk).collect(),
    );
    for k in 0..pieces_a.len().max(pieces_b.len()) {
        let mut jobs = Vec::new();
        if let Some(ids) = pieces_b.get(k) {
            jobs.push(PromptChunk { past: &b, ids });
        }
        if let Some(ids) = pieces_a.get(k) {
            jobs.push(PromptChunk { past: &a, ids });
        }
        let mut out = model.forward(&jobs, &[])?.chunks.into_iter();
        let new_b = pieces_b.get(k).and(out.next());
        let new_a = pieces_a.get(k).and(out.next());
        b.extend(new_b);
        a.extend(new_a);
    }
    let cache_a = model.prompt_cache(&a)?;
    let cache_b = model.prompt_cache(&b)?;
    let third = probe_ids(8, 7, vocab);
    let batched = model.forward(
        &[PromptChunk {
            past: &[],
            ids: &third,
        }],
        &[
            CanvasBatch {
                cache: &cache_b,
                canvases: &canvases_b,
                positions: Some(&positions_b),
                self_conditioning: None,
                labels: None,
            },
            CanvasBatch {
                cache: &cache_a,
                canvases: &canvases_a,
                positions: Some(&positions_a),
                self_conditioning: None,
                labels: None,
            },
        ],
    )?;
    let batched = batched.logits(1)?;

    let vocab = vocab as usize;
    Ok(alone
        .chunks(vocab)
        .zip(batched.chunks(vocab))
        .map(|(x, y)| label_deviation(x, y))
        .fold(0.0, f64::max))
}

#[cfg(test)]
mod tests {
    use super::label_deviation;

    #[test]
    fn identical_rows_deviate_by_nothing() {
        let row: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        assert_eq!(label_deviation(&row, &row), 0.0);
    }

    #[test]
    fn a_logit_change_shows_at_the_scale_of_a_two_label_answer() {
        let alone = vec![2.0f32, 1.0, 0.0, -1.0];
        let mut batched = alone.clone();
        batched[1] += 0.5;
        // σ(2 − 1) − σ(2 − 1.5), and no pair moves more.
        let expected = 1.0 / (1.0 + (-1.0f64).exp()) - 1.0 / (1.0 + (-0.5f64).exp());
        assert!((label_deviation(&alone, &batched) - expected.abs()).abs() < 1e-12);
    }
}
