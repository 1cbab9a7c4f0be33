//! Label probabilities reduced on the device: of a slot's vocabulary-wide logits row, only the
//! label logits, the row's max and `Σ exp(logit − max)`, and its top `ENTROPY_TOP_K` values
//! leave the device ([`SlotSummary`]); the read turns them into label probabilities and the
//! re-read entropy on the host (`read::draws::read_summary`). At a 262k vocabulary that is ~30
//! floats per slot instead of ~1 MB, and no host pass over the vocabulary.
//!
//! Each canvas batch is reduced on its own, over exactly the rows it has alone, so a read's
//! reductions run with the same shapes batched or alone (docs/batching.md).

use mlx_rs::{ops, Array};

use super::ModelError;

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

#[cfg(test)]
mod tests {
    use super::{SlotReduction, SlotSummary};
    use crate::read::draws::{needs_reread, read_slot, read_summary, SlotReading, SlotRows};
    use mlx_rs::Array;

    /// Deterministic pseudo-random logits in about ±`scale`.
    fn logits(seed: u64, rows: usize, vocab: usize, scale: f32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..rows * vocab)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn reduce(
        values: &[f32],
        rows: usize,
        labels: &[Vec<u32>],
    ) -> (Vec<SlotSummary>, Vec<Option<SlotReading>>) {
        let vocab = values.len() / rows;
        let array = Array::from_slice(values, &[rows as i32, vocab as i32]);
        let refs: Vec<&[u32]> = labels.iter().map(Vec::as_slice).collect();
        let reduction = SlotReduction::new(array, &refs).expect("reduce");
        mlx_rs::transforms::eval(reduction.outputs()).expect("eval");
        let summaries = reduction.summaries().expect("summaries");
        let readings = summaries
            .iter()
            .zip(labels)
            .map(|(s, l)| read_summary(s, l))
            .collect();
        (summaries, readings)
    }

    #[test]
    fn device_reduction_matches_the_host_one() {
        // A peaked row (certain), flat rows (uncertain, entropy ~ the top 20's), a small
        // vocabulary (every token is a top token) and labels inside and outside the top 20.
        for (seed, rows, vocab, scale) in [(1, 6, 4096, 12.0), (2, 4, 50_000, 3.0), (3, 3, 12, 5.0)]
        {
            let mut values = logits(seed, rows, vocab, scale);
            values[vocab + 7] = 40.0; // row 1: one token dominates
            let labels: Vec<Vec<u32>> = (0..rows)
                .map(|r| vec![7, (r * 31 % vocab) as u32, (vocab - 1) as u32, 7])
                .collect();
            let (summaries, device) = reduce(&values, rows, &labels);
            for (r, reading) in device.iter().enumerate() {
                let host = read_slot(&values[r * vocab..(r + 1) * vocab], &labels[r]);
                let device = reading.as_ref().expect("no tie in random logits");
                assert_eq!(device.labels, host.labels, "row {r}: label softmax bits");
                let d = (device.entropy - host.entropy).abs();
                // Probabilities: the label softmax above is exact; each top token's probability
                // exp(l − log_z) moves by p·δ(log_z).
                assert!(d <= 1e-5, "row {r} (vocab {vocab}): entropy off by {d:e}");
                let summary = &summaries[r];
                let log_z = |m: f64, s: f64| m + s.ln();
                let device_z = log_z(f64::from(summary.max), f64::from(summary.sum_exp));
                let row = &values[r * vocab..(r + 1) * vocab];
                let host_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let host_sum: f64 = row.iter().map(|&l| (f64::from(l) - host_max).exp()).sum();
                let host_z = log_z(host_max, host_sum);
                for &l in &summary.top {
                    let dp =
                        ((f64::from(l) - device_z).exp() - (f64::from(l) - host_z).exp()).abs();
                    assert!(dp <= 1e-6, "row {r}: a top probability off by {dp:e}");
                }
                // Re-read decisions through `SlotRows`: the host reduction's, always.
                let fetch = |_: usize| Ok(row.to_vec());
                let rows = SlotRows::Reduced {
                    summaries: std::slice::from_ref(summary),
                    full_row: &fetch,
                };
                let via = rows.read(0, &labels[r], vocab).expect("read");
                assert_eq!(
                    needs_reread(std::slice::from_ref(&via)),
                    needs_reread(std::slice::from_ref(&host))
                );
            }
        }
    }

    #[test]
    fn a_label_tied_with_the_last_top_value_is_read_from_the_full_row() {
        let vocab = 64;
        let mut values = logits(4, 1, vocab, 2.0);
        // 25 tokens tie at 9.0: the top 20 are ids 0..20 (lower id first), so label 22 is not
        // among them and label 3 is. The summary cannot know; the full row decides.
        for v in values.iter_mut().take(25) {
            *v = 9.0;
        }
        let labels: &[u32] = &[22, 3];
        let reduction =
            SlotReduction::new(Array::from_slice(&values, &[1, vocab as i32]), &[labels])
                .expect("reduce");
        mlx_rs::transforms::eval(reduction.outputs()).expect("eval");
        let summaries = reduction.summaries().expect("summaries");
        assert!(
            read_summary(&summaries[0], labels).is_none(),
            "a tie must not be guessed"
        );
        let fetch = |i: usize| reduction.full_row(i);
        let rows = SlotRows::Reduced {
            summaries: &summaries,
            full_row: &fetch,
        };
        assert_eq!(
            rows.read(0, labels, vocab).unwrap(),
            read_slot(&values, labels)
        );
    }
}
