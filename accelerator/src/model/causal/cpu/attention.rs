//! Grouped-query attention of one prompt chunk on the native path: each query row of each head
//! attends to exactly the keys MLX's path lets it see ([`kernels::attend_row`]: its scores, their
//! causal or sliding-window softmax, the weighted values), rows split between the cores.
//!
//! Which keys a query sees is what `ChunkMasks` and MLX's causal mode define: query `i` of the
//! chunk (absolute position `start + i`) sees the keys at positions up to its own, and on a
//! sliding layer only those less than `window` positions back. The keys are those of the earlier
//! chunks the layer uses (all of them on a full layer; on a sliding layer the trailing chunks
//! from `ChunkMasks::sliding_first`) followed by the chunk's own. A row's sums run over its own
//! span of keys in a fixed order, so its bits do not depend on where the chunk starts or how
//! long it is (docs/logit-read.md, "Exactness").

use crate::model::ModelError;

use super::kernels;

/// One layer's attention shape.
pub(super) struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Scores are multiplied by this.
    pub scale: f32,
    /// `Some(window)` on sliding-window layers.
    pub window: Option<usize>,
}

/// An earlier chunk's keys and values for one layer, each `[kv_heads, len, head_dim]`.
pub(super) struct PastKv<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub len: usize,
}

/// Buffers reused across layers.
#[derive(Default)]
pub(super) struct AttentionScratch {
    /// Per kv head, its keys over the earlier chunks and this one, transposed (`[d, stride]`).
    keys_t: Vec<Vec<f32>>,
    /// Per kv head, its values over the earlier chunks and this one (`[keys, d]`).
    values: Vec<Vec<f32>>,
    /// Per thread, the rows it attends together.
    rows: Vec<RowScratch>,
    /// Staging for one kv head's keys before transposing.
    keys: Vec<f32>,
}

/// One thread's buffers for the query rows it attends together.
#[derive(Default)]
struct RowScratch {
    queries: Vec<f32>,
    scores: Vec<f32>,
    out: Vec<f32>,
}

/// Query rows (times heads) below which the rows are not split between threads.
const ROWS_PER_THREAD: usize = 64;

/// The attention of a chunk of `len` queries at absolute positions `start ..`:
/// `q` `[heads, len, head_dim]` (normed and rotated), `k`, `v` the chunk's own
/// `[kv_heads, len, head_dim]`, `past` the earlier chunks this layer uses, whose first key sits
/// at absolute position `key_start`. Writes `out` `[len, heads · head_dim]`, each head in its
/// columns (the input of the output projection).
#[allow(clippy::too_many_arguments)]
pub(super) fn attend(
    shape: &Heads,
    q: &[f32],
    (k, v): (&[f32], &[f32]),
    past: &[PastKv<'_>],
    start: usize,
    key_start: usize,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
) -> Result<(), ModelError> {
    let d = shape.head_dim;
    if shape.kv_heads == 0 || shape.heads % shape.kv_heads != 0 || d == 0 {
        return Err(ModelError::Shape("attention heads do not group"));
    }
    let len = q.len() / (shape.heads * d);
    let group = shape.heads / shape.kv_heads;
    let past_len: usize = past.iter().map(|p| p.len).sum();
    if q.len() != shape.heads * len * d
        || k.len() != shape.kv_heads * len * d
        || v.len() != k.len()
        || out.len() != len * shape.heads * d
        || key_start + past_len != start
        || past
            .iter()
            .any(|p| p.keys.len() != shape.kv_heads * p.len * d || p.values.len() != p.keys.len())
    {
        return Err(ModelError::Shape("attention inputs disagree"));
    }
    scratch.keys_t.resize_with(shape.kv_heads, Vec::new);
    scratch.values.resize_with(shape.kv_heads, Vec::new);
    let mut stride = 0;
    for g in 0..shape.kv_heads {
        // This kv head's keys and values over the earlier chunks and this one, `[keys_len, d]`.
        scratch.keys.clear();
        let values = &mut scratch.values[g];
        values.clear();
        for (keys, vals, n) in past
            .iter()
            .map(|p| (p.keys, p.values, p.len))
            .chain([(k, v, len)])
        {
            let from = g * n * d..(g + 1) * n * d;
            scratch.keys.extend_from_slice(&keys[from.clone()]);
            values.extend_from_slice(&vals[from]);
        }
        stride = kernels::attention::transpose_keys(&scratch.keys, d, &mut scratch.keys_t[g]);
    }
    // Rows are split between threads by position, at the point that halves the keys they see.
    let threads = kernels::threads()
        .min(len * shape.heads / ROWS_PER_THREAD)
        .max(1);
    scratch.rows.resize_with(threads, RowScratch::default);
    let span = |i: usize| {
        let query = start + i;
        let hi = query + 1 - key_start;
        let lo = match shape.window {
            Some(window) => (query + 1).saturating_sub(window).saturating_sub(key_start),
            None => 0,
        };
        (lo, hi)
    };
    let total: usize = (0..len).map(|i| span(i).1 - span(i).0).sum();
    let mut bounds = vec![0usize];
    let mut seen = 0;
    for i in 0..len {
        seen += span(i).1 - span(i).0;
        if bounds.len() < threads && seen * threads >= total * bounds.len() {
            bounds.push(i + 1);
        }
    }
    bounds.push(len);
    let (keys_t, values) = (&scratch.keys_t, &scratch.values);
    let row_width = shape.heads * d;
    let together = kernels::attention::ROWS_TOGETHER;
    // One thread's positions: per position, the query heads of each kv head in groups of up to
    // ROWS_TOGETHER (they share the span and the keys), gathered and attended together.
    let rows = |first: usize, out: &mut [f32], scratch: &mut RowScratch| {
        scratch.scores.resize(together * stride, 0.0);
        scratch.queries.resize(together * d, 0.0);
        scratch.out.resize(together * d, 0.0);
        for (r, row) in out.chunks_exact_mut(row_width).enumerate() {
            let i = first + r;
            for g in 0..shape.kv_heads {
                let heads = g * group..(g + 1) * group;
                let mut head = heads.start;
                while head < heads.end {
                    let n = (heads.end - head).min(together);
                    for h in 0..n {
                        let query = &q[((head + h) * len + i) * d..][..d];
                        scratch.queries[h * d..(h + 1) * d].copy_from_slice(query);
                    }
                    kernels::attend_rows(
                        &scratch.queries[..n * d],
                        d,
                        &keys_t[g],
                        &values[g],
                        span(i),
                        shape.scale,
                        &mut scratch.scores[..n * stride],
                        &mut scratch.out[..n * d],
                    );
                    row[head * d..(head + n) * d].copy_from_slice(&scratch.out[..n * d]);
                    head += n;
                }
            }
        }
    };
    // Each thread's positions, their rows of `out` and its buffers.
    let mut pieces = Vec::with_capacity(threads);
    let mut rest = &mut out[..];
    for ((first, end), scratch) in bounds
        .windows(2)
        .map(|w| (w[0], w[1]))
        .zip(scratch.rows.iter_mut())
    {
        let (these, others) = rest.split_at_mut((end - first) * row_width);
        rest = others;
        pieces.push((first, these, scratch));
    }
    kernels::on_threads(pieces, |(first, these, scratch)| {
        rows(first, these, scratch)
    });
    Ok(())
}
