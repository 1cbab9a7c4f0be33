//! The device's slot reduction (`model::diffusion_gemma::reduce`) against the read's own host reduction: the
//! same label probabilities bit for bit, the same re-read decisions. Here, above both, so that
//! the model never imports the read.

use crate::model::diffusion_gemma::reduce::{SlotReduction, SlotSummary};
use crate::read::diffusion::draws::{needs_reread, read_slot, read_summary, SlotReading, SlotRows};
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
    for (seed, rows, vocab, scale) in [(1, 6, 4096, 12.0), (2, 4, 50_000, 3.0), (3, 3, 12, 5.0)] {
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
                let dp = ((f64::from(l) - device_z).exp() - (f64::from(l) - host_z).exp()).abs();
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
    let reduction = SlotReduction::new(Array::from_slice(&values, &[1, vocab as i32]), &[labels])
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
