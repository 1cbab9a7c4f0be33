//! Noise draws and what is read from them: which tokens the noise puts in the slots, each slot's
//! label distribution and entropy, the re-read rule, and the mean over draws.

use super::plan::Slot;
use super::rng::PythonRandom;
use crate::model::diffusion_gemma::reduce::{SlotSummary, ENTROPY_TOP_K};
use crate::model::ModelError;

/// The reference's default noise seed.
pub const DEFAULT_SEED: u64 = 42;
/// Seed offset between the reads (groups) of one request.
pub const GROUP_SEED_STRIDE: u64 = 104_729;
/// Seed offset between the draws of one batch.
pub const DRAW_SEED_STRIDE: u64 = 7_919;
/// Entropy (nats) above which a read takes more draws.
pub const REREAD_THRESHOLD: f64 = 0.1;
/// How close to [`REREAD_THRESHOLD`] an entropy from a device summary may fall before the
/// full row is read instead: the summary's float32 `Σ exp` moves the entropy by up to ~1e-5
/// (measured ≤ 2e-6), so beyond this margin the re-read decision is the host reduction's.
pub const ENTROPY_MARGIN: f64 = 1e-4;
/// Draws in all when the re-read rule fires.
pub const REREAD_DRAWS: usize = 4;
/// Most draws a caller may ask for with `x_draws`.
pub const MAX_DRAWS: u32 = 64;

/// The seed of read (group) `k` of a request.
pub fn group_seed(base: u64, k: usize) -> u64 {
    base + GROUP_SEED_STRIDE * k as u64
}

/// Seeds of a batch of `count` draws starting at `start`.
pub fn draw_seeds(start: u64, count: usize) -> Vec<u64> {
    (0..count)
        .map(|i| start + DRAW_SEED_STRIDE * i as u64)
        .collect()
}

/// Seeds of the re-reads that follow a first draw with `seed`: `seed + 1`, then the draw stride.
pub fn reread_seeds(seed: u64) -> Vec<u64> {
    draw_seeds(seed + 1, REREAD_DRAWS - 1)
}

/// The canvas of one draw: the template with every slot replaced by a uniformly random token id
/// in `[0, vocab)`, drawn in slot order from `random.Random(seed)`.
pub fn noised_canvas(canvas: &[u32], slots: &[Slot], seed: u64, vocab: u32) -> Vec<u32> {
    let mut rng = PythonRandom::new(seed);
    let mut out = canvas.to_vec();
    for slot in slots {
        out[slot.position] = rng.randrange(vocab);
    }
    out
}

/// What one slot of one draw says.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotReading {
    /// Softmax over the question's label logits (temperature 1), in label order.
    pub labels: Vec<f64>,
    /// `−Σ p ln p` over the top-20 tokens ∪ the labels, with full-vocabulary probabilities.
    pub entropy: f64,
}

/// Softmax over a slot's label logits (temperature 1), in label order, in f64. Computed from the
/// label logits alone — the full-vocabulary normaliser cancels — so the host and the device
/// reduction ([`SlotSummary`]) give the same bits.
fn label_softmax(label_logits: impl Iterator<Item = f32> + Clone) -> Vec<f64> {
    let top = label_logits
        .clone()
        .map(f64::from)
        .fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = label_logits.map(|l| (f64::from(l) - top).exp()).collect();
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

/// `−p ln p` of a token whose log-probability is `lp`.
fn neg_p_log_p(lp: f64) -> f64 {
    -(lp.exp() * lp)
}

/// Reads one slot from its full-vocabulary logits row (the host-side f64 reduction).
pub fn read_slot(logits: &[f32], label_ids: &[u32]) -> SlotReading {
    // log-softmax normaliser over the whole vocabulary, accumulated in f64.
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let log_z = max + sum.ln();
    let logprob = |id: u32| logits[id as usize] as f64 - log_z;

    let labels = label_softmax(label_ids.iter().map(|&id| logits[id as usize]));

    let mut returned: Vec<u32> = top_k_ids(logits, ENTROPY_TOP_K);
    for &id in label_ids {
        if !returned.contains(&id) {
            returned.push(id);
        }
    }
    let entropy = returned.iter().map(|&id| neg_p_log_p(logprob(id))).sum();
    SlotReading { labels, entropy }
}

/// Reads one slot from its device summary: the same label softmax as [`read_slot`] (bit for
/// bit), and the entropy within ~1e-5 of it (float32 `sum_exp`; see [`ENTROPY_MARGIN`]). `None` when a label's logit
/// equals the smallest of the top values: whether that label is among the top ids then depends
/// on the lower-id-first tie break over the whole row, so the caller reads the full row instead.
pub fn read_summary(summary: &SlotSummary, label_ids: &[u32]) -> Option<SlotReading> {
    let log_z = f64::from(summary.max) + f64::from(summary.sum_exp).ln();
    let labels = label_softmax(summary.label_logits.iter().copied());
    let mut top = summary.top.clone();
    top.sort_by(|a, b| b.total_cmp(a));
    let threshold = top.last().copied().unwrap_or(f32::NEG_INFINITY);
    // Every token of a vocabulary smaller than the top count is a top token.
    let whole_vocab = top.len() < ENTROPY_TOP_K;
    let mut entropy: f64 = top.iter().map(|&l| neg_p_log_p(f64::from(l) - log_z)).sum();
    let mut counted: Vec<u32> = Vec::new();
    for (&id, &l) in label_ids.iter().zip(&summary.label_logits) {
        if whole_vocab || l > threshold || counted.contains(&id) {
            continue;
        }
        if l == threshold {
            return None;
        }
        counted.push(id);
        entropy += neg_p_log_p(f64::from(l) - log_z);
    }
    Some(SlotReading { labels, entropy })
}

/// A decoder pass's slot rows, `[draw][slot]` in order, as the read receives them.
pub enum SlotRows<'a> {
    /// Full-vocabulary logits rows, flattened (`[draw][slot][vocab]`).
    Full(&'a [f32]),
    /// Rows reduced on the device; `full_row(i)` fetches row `i` whole for the rare tie
    /// [`read_summary`] cannot settle.
    Reduced {
        summaries: &'a [SlotSummary],
        full_row: &'a dyn Fn(usize) -> Result<Vec<f32>, ModelError>,
    },
}

/// Why a decoder pass's rows could not be read as slots: rows the pass did not return (a bug in
/// how the read was planned or batched) or the model failing to fetch a full row.
#[derive(Debug, thiserror::Error)]
pub enum SlotRowError {
    #[error("no logits row {0}")]
    MissingRow(usize),
    #[error("no slot summary {0}")]
    MissingSummary(usize),
    #[error("slot summary {index} has {found} label logits, the slot {expected} labels")]
    LabelCount {
        index: usize,
        found: usize,
        expected: usize,
    },
    #[error("fetching a full logits row: {0}")]
    FullRow(#[from] ModelError),
}

impl SlotRows<'_> {
    /// How many rows there are, given the vocabulary.
    pub fn len(&self, vocab: usize) -> usize {
        match self {
            SlotRows::Full(values) => values.len() / vocab.max(1),
            SlotRows::Reduced { summaries, .. } => summaries.len(),
        }
    }

    /// Reads row `index` as a slot with these labels.
    pub fn read(
        &self,
        index: usize,
        label_ids: &[u32],
        vocab: usize,
    ) -> Result<SlotReading, SlotRowError> {
        match self {
            SlotRows::Full(values) => values
                .get(index * vocab..(index + 1) * vocab)
                .map(|row| read_slot(row, label_ids))
                .ok_or(SlotRowError::MissingRow(index)),
            SlotRows::Reduced {
                summaries,
                full_row,
            } => {
                let summary = summaries
                    .get(index)
                    .ok_or(SlotRowError::MissingSummary(index))?;
                if summary.label_logits.len() != label_ids.len() {
                    return Err(SlotRowError::LabelCount {
                        index,
                        found: summary.label_logits.len(),
                        expected: label_ids.len(),
                    });
                }
                match read_summary(summary, label_ids) {
                    Some(reading)
                        if (reading.entropy - REREAD_THRESHOLD).abs() > ENTROPY_MARGIN =>
                    {
                        Ok(reading)
                    }
                    // A tie at the top values, or an entropy too close to the threshold for
                    // float32's sum to decide: the host reduction of the full row settles it.
                    _ => Ok(read_slot(&full_row(index)?, label_ids)),
                }
            }
        }
    }
}

/// Ids of the `k` largest logits (lower id first among equals).
pub(crate) fn top_k_ids(logits: &[f32], k: usize) -> Vec<u32> {
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (id, &l) in logits.iter().enumerate() {
        if best.len() < k || l > best[best.len() - 1].0 {
            let at = best.partition_point(|&(b, _)| b >= l);
            best.insert(at, (l, id as u32));
            best.truncate(k);
        }
    }
    best.into_iter().map(|(_, id)| id).collect()
}

/// Whether the first draw is uncertain enough to take more: the largest slot entropy is
/// strictly above the threshold.
pub fn needs_reread(first_draw: &[SlotReading]) -> bool {
    first_draw
        .iter()
        .map(|s| s.entropy)
        .fold(f64::NEG_INFINITY, f64::max)
        > REREAD_THRESHOLD
}

/// Arithmetic mean of one question's label distributions over draws, summed in draw order.
pub fn mean_distribution(draws: &[&SlotReading]) -> Vec<f64> {
    let n = draws.first().map(|d| d.labels.len()).unwrap_or(0);
    (0..n)
        .map(|li| draws.iter().fold(0.0, |acc, d| acc + d.labels[li]) / draws.len() as f64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_follow_the_reference_schedule() {
        assert_eq!(group_seed(42, 0), 42);
        assert_eq!(group_seed(42, 2), 42 + 2 * 104_729);
        assert_eq!(reread_seeds(42), [43, 43 + 7919, 43 + 2 * 7919]);
        assert_eq!(draw_seeds(42, 3), [42, 42 + 7919, 42 + 2 * 7919]);
    }

    #[test]
    fn noise_touches_only_the_slots() {
        let canvas = vec![100, 7, 8, 9, 106, 0, 0, 0];
        let slots = vec![
            Slot {
                position: 1,
                label_ids: vec![7, 70],
            },
            Slot {
                position: 3,
                label_ids: vec![9, 90],
            },
        ];
        let noised = noised_canvas(&canvas, &slots, 42, 262_144);
        assert_eq!(noised, vec![100, 58369, 8, 13112, 106, 0, 0, 0]);
    }

    #[test]
    fn slot_reading_is_a_label_softmax_with_full_vocab_entropy() {
        let mut logits = vec![0.0f32; 50];
        logits[3] = 2.0;
        logits[4] = 1.0;
        let r = read_slot(&logits, &[3, 4]);
        let e = (1.0f64).exp();
        assert!((r.labels[0] - e / (e + 1.0)).abs() < 1e-12);
        // Entropy over the top 20 ∪ labels with full-vocab probabilities.
        let z: f64 = (2.0f64).exp() + e + 48.0;
        let p = |l: f64| l.exp() / z;
        let mut expected = -(p(2.0) * p(2.0).ln() + p(1.0) * p(1.0).ln());
        expected -= 18.0 * p(0.0) * p(0.0).ln();
        assert!(
            (r.entropy - expected).abs() < 1e-9,
            "{} vs {}",
            r.entropy,
            expected
        );
    }

    #[test]
    fn reread_is_strictly_above_threshold_and_mean_is_plain() {
        let sure = SlotReading {
            labels: vec![1.0, 0.0],
            entropy: 0.1,
        };
        let unsure = SlotReading {
            labels: vec![0.5, 0.5],
            entropy: 0.6,
        };
        assert!(!needs_reread(std::slice::from_ref(&sure)));
        assert!(needs_reread(&[sure.clone(), unsure.clone()]));
        assert_eq!(mean_distribution(&[&sure, &unsure]), vec![0.75, 0.25]);
    }

    #[test]
    fn top_k_keeps_the_largest() {
        let logits = [0.5f32, 3.0, -1.0, 3.0, 2.0];
        assert_eq!(top_k_ids(&logits, 3), vec![1, 3, 4]);
    }
}
