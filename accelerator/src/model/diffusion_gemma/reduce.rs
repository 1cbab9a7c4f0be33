//! Label probabilities reduced on the device: of a slot's vocabulary-wide logits row, only the
//! label logits, the row's max and `Σ exp(logit − max)`, and its top `ENTROPY_TOP_K` values
//! leave the device ([`SlotSummary`]); the read turns them into label probabilities and the
//! re-read entropy on the host (`read::draws::read_summary`). At a 262k vocabulary that is ~30
//! floats per slot instead of ~1 MB, and no host pass over the vocabulary.
//!
//! Each canvas batch is reduced on its own, over exactly the rows it has alone, so a read's
//! reductions run with the same shapes batched or alone (docs/batching.md).

use mlx_rs::{ops, Array};

use crate::model::ModelError;

/// Tokens of the full distribution that enter the re-read entropy, besides the labels (the
/// read's rule; the device keeps this many of each row's largest logits for it).
pub const ENTROPY_TOP_K: usize = 20;

/// One slot row as the device reduced it: what the read (`read::draws::read_summary`) needs of a
/// vocabulary-wide logits row, and nothing more.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotSummary {
    /// The logits of the slot's label ids, in label order.
    pub label_logits: Vec<f32>,
    /// The row's largest logit.
    pub max: f32,
    /// `Σ exp(logit − max)` over the row (float32 on the device; in `[1, vocab]`, so its
    /// relative error, not `log_z`'s absolute one, is what float32 limits).
    pub sum_exp: f32,
    /// The `min(ENTROPY_TOP_K, vocab)` largest logits, any order.
    pub top: Vec<f32>,
}

/// The lazy device reductions of one canvas batch's slot rows, and the rows themselves (kept
/// for the rare row the summary cannot settle).
#[derive(Debug)]
pub struct SlotReduction {
    /// `[rows, vocab]` float32 (computed with the reductions, never copied unless asked).
    rows: Array,
    /// `[rows, 2 + k]`: each row's max, `Σ exp(logit − max)`, then its top `k` values (one
    /// array, freshly written by the join, so it reads back contiguously).
    stats: Array,
    /// `[Σ labels]`: every row's label logits, row after row.
    labels: Array,
    /// Labels per row.
    label_counts: Vec<usize>,
}

impl SlotReduction {
    /// Builds the reductions of `rows` (`[n, vocab]` float32) for rows whose label ids are
    /// `labels[i]` (lazy: evaluate [`SlotReduction::outputs`]).
    pub fn new(rows: Array, labels: &[&[u32]]) -> Result<Self, ModelError> {
        let shape = rows.shape();
        let (n, vocab) = match shape {
            [n, v] => (*n, *v),
            _ => return Err(ModelError::Shape("slot rows must be [rows, vocab]")),
        };
        if labels.len() != n as usize {
            return Err(ModelError::Shape("one label list per slot row"));
        }
        let mut flat: Vec<i32> = Vec::with_capacity(labels.iter().map(|l| l.len()).sum());
        for (row, ids) in labels.iter().enumerate() {
            for &id in *ids {
                if id as i64 >= vocab as i64 {
                    return Err(ModelError::TokenOutOfRange { token: id, vocab });
                }
                flat.push(row as i32 * vocab + id as i32);
            }
        }
        let max = rows.max_axis(-1, true)?;
        let sum_exp = ops::exp(ops::subtract(&rows, &max)?)?.sum_axis(-1, true)?;
        let k = (ENTROPY_TOP_K as i32).min(vocab);
        let top = ops::indexing::topk_axis(&rows, k, -1)?;
        let stats = ops::concatenate(&[max, sum_exp, top], 1)?;
        let labels_out = rows.take(Array::from_slice(&flat, &[flat.len() as i32]))?;
        Ok(SlotReduction {
            stats,
            labels: labels_out,
            label_counts: labels.iter().map(|l| l.len()).collect(),
            rows,
        })
    }

    /// What to evaluate (the small outputs only).
    pub fn outputs(&self) -> [&Array; 2] {
        [&self.stats, &self.labels]
    }

    /// The summaries, one per row (evaluates the outputs if they are not yet).
    pub fn summaries(&self) -> Result<Vec<SlotSummary>, ModelError> {
        let read = |a: &Array| -> Result<Vec<f32>, ModelError> {
            Ok(a.try_as_slice::<f32>()
                .map_err(|_| ModelError::Shape("reduced logits are not contiguous float32"))?
                .to_vec())
        };
        let (stats, labels) = (read(&self.stats)?, read(&self.labels)?);
        let width = self.stats.dim(1) as usize;
        let mut at = 0;
        let mut out = Vec::with_capacity(self.label_counts.len());
        for (row, &count) in self.label_counts.iter().enumerate() {
            let (Some(row_stats), Some(l)) = (
                stats.get(row * width..(row + 1) * width),
                labels.get(at..at + count),
            ) else {
                return Err(ModelError::Shape("reduced logits shorter than their rows"));
            };
            at += count;
            out.push(SlotSummary {
                label_logits: l.to_vec(),
                max: row_stats[0],
                sum_exp: row_stats[1],
                top: row_stats[2..].to_vec(),
            });
        }
        Ok(out)
    }

    /// Row `i` whole (copies that one row from the device).
    pub fn full_row(&self, i: usize) -> Result<Vec<f32>, ModelError> {
        if i >= self.rows.dim(0) as usize {
            return Err(ModelError::Shape("no such slot row"));
        }
        let row = self
            .rows
            .take_axis(Array::from_slice(&[i as i32], &[1]), 0)?;
        Ok(row
            .try_as_slice::<f32>()
            .map_err(|_| ModelError::Shape("logits are not contiguous float32"))?
            .to_vec())
    }
}
