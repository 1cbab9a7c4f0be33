//! How a request's sequences are computed: split into chunks at the chunk length and where they
//! part, restored from the prefix cache where it can, the chunks of one step in one batched
//! pass, and the final-norm hidden states taken at the positions each read needs (the label
//! read: the last; a kev read: its markers and the last).

use mlx_rs::Array;

use hunch_core::{ReadError, ReadStats};

use super::CausalEngine;
use crate::model::causal::CausalChunk;
use crate::read::logits::ScoringSequence;

impl CausalEngine {
    /// Where sequence `i` of a request's `sequences` is split into chunks: every multiple of
    /// the chunk length and its end; and, where the model's bits do not depend on the split
    /// ([`splits_anywhere`](crate::model::causal::CausalLm::splits_anywhere)), wherever it
    /// stops sharing tokens with another of the request's sequences, so that the common prefix
    /// is computed once to the exact token.
    pub(super) fn bounds(&self, sequences: &[ScoringSequence], i: usize) -> Vec<usize> {
        let tokens = &sequences[i].tokens;
        let mut bounds: Vec<usize> = (1..=tokens.len() / self.chunk)
            .map(|k| k * self.chunk)
            .chain([tokens.len()])
            .collect();
        if self.model.splits_anywhere() {
            for (j, other) in sequences.iter().enumerate() {
                let common = tokens
                    .iter()
                    .zip(&other.tokens)
                    .take_while(|(a, b)| a == b)
                    .count();
                if j != i && common > 0 && common < tokens.len() {
                    bounds.push(common);
                }
            }
        }
        bounds.sort_unstable();
        bounds.dedup();
        bounds
    }

    /// Every sequence's hidden states after the final norm at its positions `wanted[i]`
    /// (ascending; the label read: its last), in order: each restores its longest cached run of
    /// chunks before its first wanted position (the cache keeps K/V, not hidden states), then
    /// the sequences advance together one chunk at a time (to their next bound,
    /// [`CausalEngine::bounds`]), the chunks of one step in one batched pass
    /// ([`forward_batch_rows`](crate::model::causal::CausalLm::forward_batch_rows)), a chunk
    /// that several sequences share (the same tokens from position 0 through its end, the same
    /// start) computed once for all of them. Each
    /// chunk that ends at a multiple of the chunk length or at a split point is kept in the
    /// cache for later requests.
    pub(super) fn prefill_sequences(
        &mut self,
        sequences: &[ScoringSequence],
        wanted: &[Vec<usize>],
        stats: &mut ReadStats,
    ) -> Result<Vec<Vec<Array>>, ReadError> {
        struct Progress {
            bounds: Vec<usize>,
            chunks: Vec<CausalChunk>,
            at: usize,
            hidden: Vec<Array>,
        }
        if wanted.len() != sequences.len()
            || sequences.iter().zip(wanted).any(|(s, w)| {
                w.is_empty()
                    || w.iter().any(|&p| p >= s.tokens.len())
                    || w.windows(2).any(|pair| pair[0] >= pair[1])
            })
        {
            return Err(ReadError::internal(
                "the positions read are not ascending positions of their sequences",
            ));
        }
        let mut progress = Vec::with_capacity(sequences.len());
        for (i, sequence) in sequences.iter().enumerate() {
            let bounds = self.bounds(sequences, i);
            // Restored up to the first position read at most: that one is computed.
            let first = wanted[i][0];
            let (chunks, reused) = self.cache.restore(
                &sequence.tokens[..=first],
                &bounds,
                self.model.splits_anywhere(),
            );
            stats.prompt_tokens += sequence.tokens.len() as u64;
            stats.reused_tokens += reused as u64;
            if reused > 0 {
                stats.cache_hits += 1;
            }
            progress.push(Progress {
                bounds,
                chunks,
                at: reused,
                hidden: Vec::with_capacity(wanted[i].len()),
            });
        }
        loop {
            // This step's chunks: (the sequence that computes it, start, end, the sequences that
            // take it).
            let mut step: Vec<(usize, usize, usize, Vec<usize>)> = Vec::new();
            for (i, p) in progress.iter().enumerate() {
                let tokens = &sequences[i].tokens;
                let Some(&end) = p.bounds.iter().find(|&&b| b > p.at) else {
                    continue;
                };
                let same = step.iter_mut().find(|(j, at, e, _)| {
                    *at == p.at && *e == end && sequences[*j].tokens[..end] == tokens[..end]
                });
                match same {
                    Some((_, _, _, takers)) => takers.push(i),
                    None => step.push((i, p.at, end, vec![i])),
                }
            }
            if step.is_empty() {
                break;
            }
            for batch in step.chunks(self.batch_chunks()) {
                let items: Vec<(&[u32], &[CausalChunk])> = batch
                    .iter()
                    .map(|(i, at, end, _)| {
                        (&sequences[*i].tokens[*at..*end], &progress[*i].chunks[..])
                    })
                    .collect();
                // Each chunk's rows that any of its takers reads.
                let rows: Vec<Vec<usize>> = batch
                    .iter()
                    .map(|(_, at, end, takers)| {
                        let mut rows: Vec<usize> = takers
                            .iter()
                            .flat_map(|&t| &wanted[t])
                            .filter(|&&p| *at <= p && p < *end)
                            .map(|&p| p - at)
                            .collect();
                        rows.sort_unstable();
                        rows.dedup();
                        rows
                    })
                    .collect();
                let done = self.model.forward_batch_rows(&items, &rows).map_err(|e| {
                    let questions: Vec<String> = batch
                        .iter()
                        .map(|(i, ..)| sequences[*i].question.to_string())
                        .collect();
                    ReadError::internal(format!(
                        "questions {}: forward pass: {e}",
                        questions.join(", ")
                    ))
                })?;
                stats.forwards += 1;
                let batch_rows: usize = batch.iter().map(|(_, at, end, _)| end - at).sum();
                stats.max_batch_rows = stats.max_batch_rows.max(batch_rows as u32);
                for (((i, at, end, takers), (chunk, hidden)), rows) in
                    batch.iter().zip(done).zip(&rows)
                {
                    if *end < sequences[*i].tokens.len() || end - at == self.chunk {
                        self.cache
                            .store(&sequences[*i].tokens[..*end], *at, chunk.clone());
                    }
                    for &t in takers {
                        let p = &mut progress[t];
                        p.chunks.push(chunk.clone());
                        p.at = *end;
                        for &position in wanted[t].iter().filter(|&&q| *at <= q && q < *end) {
                            if let Ok(row) = rows.binary_search(&(position - at)) {
                                p.hidden.push(hidden[row].clone());
                            }
                        }
                        if t != *i {
                            stats.reused_tokens += (end - at) as u64;
                        }
                    }
                }
            }
        }
        progress
            .into_iter()
            .zip(sequences)
            .zip(wanted)
            .map(|((p, sequence), wanted)| {
                if p.hidden.len() != wanted.len() {
                    return Err(ReadError::internal(format!(
                        "question {}: {} of its {} hidden states read",
                        sequence.question,
                        p.hidden.len(),
                        wanted.len()
                    )));
                }
                Ok(p.hidden)
            })
            .collect()
    }

    /// Chunks computed in one batched pass at most (about 1,024 rows: the stacked activations of
    /// a 1B model's feed-forward then take ~70 MB).
    fn batch_chunks(&self) -> usize {
        (1024 / self.chunk).max(1)
    }
}
