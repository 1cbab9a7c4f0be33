//! Grouped-query attention of one prompt chunk on the native path: per kv head, the scores of
//! its query heads against the keys (one `sgemm`), the causal or sliding-window softmax of each
//! row over exactly the keys MLX's path lets it see, and the weighted values (one `sgemm` per
//! query head, written straight into the output's columns).
//!
//! Which keys a query sees is what `ChunkMasks` and MLX's causal mode define: query `i` of the
//! chunk (absolute position `start + i`) sees the keys at positions up to its own, and on a
//! sliding layer only those less than `window` positions back. The keys are those of the earlier
//! chunks the layer uses (all of them on a full layer; on a sliding layer the trailing chunks
//! from `ChunkMasks::sliding_first`) followed by the chunk's own, so the shapes of every product
//! depend only on the chunk's position (docs/logit-read.md, "Exactness").

use crate::blas;
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

/// Buffers reused across layers and kv heads.
#[derive(Default)]
pub(super) struct AttentionScratch {
    keys: Vec<f32>,
    values: Vec<f32>,
    scores: Vec<f32>,
}

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
    let keys_len = past_len + len;
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
    scratch.keys.resize(keys_len * d, 0.0);
    scratch.values.resize(keys_len * d, 0.0);
    scratch.scores.resize(group * len * keys_len, 0.0);
    for g in 0..shape.kv_heads {
        // This kv head's keys and values over the earlier chunks and this one, `[keys_len, d]`.
        let mut at = 0;
        for (keys, values, n) in past
            .iter()
            .map(|p| (p.keys, p.values, p.len))
            .chain([(k, v, len)])
        {
            let from = g * n * d..(g + 1) * n * d;
            scratch.keys[at..at + n * d].copy_from_slice(&keys[from.clone()]);
            scratch.values[at..at + n * d].copy_from_slice(&values[from]);
            at += n * d;
        }
        // The scores of the group's query heads, `[group · len, keys_len]`.
        let queries = &q[g * group * len * d..(g + 1) * group * len * d];
        blas::sgemm(
            true,
            (group * len, keys_len, d),
            shape.scale,
            (queries, d),
            (&scratch.keys, d),
            0.0,
            (&mut scratch.scores, keys_len),
        )?;
        for (r, row) in scratch.scores.chunks_exact_mut(keys_len).enumerate() {
            let query = start + r % len;
            // Keys up to the query's own position, and within the window on sliding layers.
            let hi = query + 1 - key_start;
            let lo = match shape.window {
                Some(window) => (query + 1).saturating_sub(window).saturating_sub(key_start),
                None => 0,
            };
            kernels::softmax_span(row, lo, hi);
        }
        for h in 0..group {
            let head = g * group + h;
            let probabilities = &scratch.scores[h * len * keys_len..(h + 1) * len * keys_len];
            blas::sgemm(
                false,
                (len, d, keys_len),
                1.0,
                (probabilities, keys_len),
                (&scratch.values, d),
                0.0,
                (&mut out[head * d..], shape.heads * d),
            )?;
        }
    }
    Ok(())
}
