//! The chat engines' prefix cache: prompt chunks (their keys and values) by the exact tokens
//! from position 0 through their end, least recently used evicted first past a byte budget.

use std::collections::HashMap;

use crate::model::causal::CausalChunk;

/// Prompt chunks by the exact tokens from position 0 through their end (and where they start),
/// least recently used evicted first once the budget is passed.
pub(super) struct ChunkCache {
    budget: u64,
    pub(super) bytes: u64,
    clock: u64,
    entries: HashMap<Vec<u32>, CacheEntry>,
}

struct CacheEntry {
    /// The position the chunk starts at (its end is the key's length).
    start: usize,
    chunk: CausalChunk,
    bytes: u64,
    used: u64,
}

impl ChunkCache {
    pub(super) fn new(budget: u64) -> Self {
        ChunkCache {
            budget,
            bytes: 0,
            clock: 0,
            entries: HashMap::new(),
        }
    }

    /// The cached chunks that begin `tokens`, in order, each ending at one of `bounds`
    /// (ascending) and starting where the one before it ends, the longest such run that leaves
    /// at least one token to compute (the last position's hidden state is what the read needs);
    /// and the tokens they cover. With `partial` (a model whose bits do not depend on where a
    /// prompt is split), the run then takes the first positions of a cached chunk that starts
    /// there and goes on as `tokens` do for a while (an earlier request's chunk, past the point
    /// where the two requests part): what llama.cpp's reuse of its cache's common prefix
    /// computes, to the token.
    pub(super) fn restore(
        &mut self,
        tokens: &[u32],
        bounds: &[usize],
        partial: bool,
    ) -> (Vec<CausalChunk>, usize) {
        let mut found = Vec::new();
        let mut at = 0;
        loop {
            // The farthest bound whose chunk starts here.
            let next = bounds.iter().rev().find(|&&end| {
                end > at
                    && end < tokens.len()
                    && self
                        .entries
                        .get(&tokens[..end])
                        .is_some_and(|e| e.start == at)
            });
            let Some(&end) = next else { break };
            self.clock += 1;
            if let Some(entry) = self.entries.get_mut(&tokens[..end]) {
                entry.used = self.clock;
                found.push(entry.chunk.clone());
            }
            at = end;
        }
        if partial {
            if let Some((n, key)) = self.longest_start(tokens, at) {
                if let Some(entry) = self.entries.get_mut(&key) {
                    if let Some(chunk) = entry.chunk.prefix(n) {
                        self.clock += 1;
                        entry.used = self.clock;
                        found.push(chunk);
                        at += n;
                    }
                }
            }
        }
        (found, at)
    }

    /// The cached chunk that starts at `at` after `tokens[..at]` and shares the most tokens
    /// with `tokens` from there (leaving at least the last one to compute): how many, and its
    /// key.
    fn longest_start(&self, tokens: &[u32], at: usize) -> Option<(usize, Vec<u32>)> {
        let room = tokens.len().checked_sub(at + 1)?;
        self.entries
            .iter()
            .filter(|(key, e)| e.start == at && key.len() > at && key[..at] == tokens[..at])
            .map(|(key, _)| {
                let shared = key[at..]
                    .iter()
                    .zip(&tokens[at..])
                    .take_while(|(a, b)| a == b)
                    .count();
                (shared.min(room), key)
            })
            .filter(|(n, _)| *n > 0)
            .max_by_key(|(n, _)| *n)
            .map(|(n, key)| (n, key.clone()))
    }

    /// Keeps `chunk`, the last chunk of `prefix`, which starts at `start`.
    pub(super) fn store(&mut self, prefix: &[u32], start: usize, chunk: CausalChunk) {
        if self.budget == 0 || self.entries.contains_key(prefix) {
            return;
        }
        let bytes = chunk.nbytes() as u64 + 4 * prefix.len() as u64;
        if bytes > self.budget {
            return;
        }
        while self.bytes + bytes > self.budget {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(gone) = self.entries.remove(&oldest) {
                self.bytes -= gone.bytes;
            }
        }
        self.clock += 1;
        self.bytes += bytes;
        self.entries.insert(
            prefix.to_vec(),
            CacheEntry {
                start,
                chunk,
                bytes,
                used: self.clock,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv::LayerKv;
    use mlx_rs::Array;

    fn chunk(tokens: &[u32]) -> CausalChunk {
        let kv = LayerKv {
            keys: Array::zeros::<f32>(&[1, 1, tokens.len() as i32, 4]).expect("zeros"),
            values: Array::zeros::<f32>(&[1, 1, tokens.len() as i32, 4]).expect("zeros"),
        };
        CausalChunk {
            tokens: tokens.to_vec(),
            kv: vec![kv],
        }
    }

    /// Multiples of 4 up to `len`, and `len`: the bounds of a model split only at chunks.
    fn whole(len: usize) -> Vec<usize> {
        (1..=len / 4).map(|k| 4 * k).chain([len]).collect()
    }

    #[test]
    fn whole_chunks_are_restored_by_exact_prefix_leaving_a_token_to_compute() {
        let mut cache = ChunkCache::new(1 << 20);
        let tokens: Vec<u32> = (0..10).collect();
        cache.store(&tokens[..4], 0, chunk(&tokens[..4]));
        cache.store(&tokens[..8], 4, chunk(&tokens[4..8]));
        assert_eq!(cache.restore(&tokens, &whole(10), false).1, 8);
        // A prompt that ends at a chunk bound keeps its last chunk to compute.
        let (found, at) = cache.restore(&tokens[..8], &whole(8), false);
        assert_eq!((found.len(), at), (1, 4));
        // Another first chunk: nothing, even though the second chunk's tokens match.
        let mut other = tokens.clone();
        other[0] = 99;
        assert_eq!(cache.restore(&other, &whole(10), false).1, 0);
    }

    #[test]
    fn chunks_that_end_at_a_split_point_join_only_where_they_start() {
        let mut cache = ChunkCache::new(1 << 20);
        let tokens: Vec<u32> = (0..12).collect();
        // Split at 6 (a point another sequence stopped sharing at), then the chunk bound 8.
        cache.store(&tokens[..4], 0, chunk(&tokens[..4]));
        cache.store(&tokens[..6], 4, chunk(&tokens[4..6]));
        cache.store(&tokens[..8], 6, chunk(&tokens[6..8]));
        let (found, at) = cache.restore(&tokens, &[4, 6, 8, 12], false);
        assert_eq!((found.len(), at), (3, 8));
        // Without 6 among the bounds, the chunk to 8 does not start where the one to 4 ends.
        assert_eq!(cache.restore(&tokens, &[4, 8, 12], false).1, 4);
        // The farthest chunk that starts here is taken: a whole chunk 4..8 beats 4..6.
        let mut whole_first = ChunkCache::new(1 << 20);
        whole_first.store(&tokens[..4], 0, chunk(&tokens[..4]));
        whole_first.store(&tokens[..8], 4, chunk(&tokens[4..8]));
        whole_first.store(&tokens[..6], 4, chunk(&tokens[4..6]));
        let (found, at) = whole_first.restore(&tokens, &[4, 6, 8, 12], false);
        assert_eq!((found.len(), at), (2, 8));
    }

    /// A chunk whose keys and values say which position they hold.
    fn numbered(tokens: &[u32]) -> CausalChunk {
        let n = tokens.len();
        let values: Vec<f32> = (0..2 * n * 3).map(|i| i as f32).collect();
        let kv = LayerKv {
            keys: Array::from_slice(&values, &[1, 2, n as i32, 3]),
            values: Array::from_slice(&values, &[1, 2, n as i32, 3]),
        };
        CausalChunk {
            tokens: tokens.to_vec(),
            kv: vec![kv],
        }
    }

    #[test]
    fn part_of_a_chunk_is_restored_where_a_later_prompt_parts_from_it() {
        let mut cache = ChunkCache::new(1 << 20);
        let earlier: Vec<u32> = (0..8).collect();
        cache.store(&earlier[..4], 0, numbered(&earlier[..4]));
        cache.store(&earlier[..8], 4, numbered(&earlier[4..8]));
        // Shares 6 tokens with the earlier prompt: one whole chunk and two positions of the next.
        let later = [0, 1, 2, 3, 4, 5, 99, 98, 97];
        assert_eq!(cache.restore(&later, &whole(9), false).1, 4);
        let (found, at) = cache.restore(&later, &whole(9), true);
        assert_eq!(at, 6);
        let part = &found[1];
        assert_eq!(part.tokens, vec![4, 5]);
        // Each head's first two positions (3 values each), heads kept apart.
        let keys = part.kv[0].keys.try_as_slice::<f32>().expect("f32");
        assert_eq!(
            keys,
            &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0]
        );
        assert_eq!(part.kv[0].keys.shape(), &[1, 2, 2, 3]);
        // At least the last token is left to compute.
        let (_, at) = cache.restore(&earlier[..6], &whole(6), true);
        assert_eq!(at, 5);
        // Another start: nothing of the chunk that begins at 4 after other tokens.
        let other = [9, 1, 2, 3, 4, 5, 6];
        assert_eq!(cache.restore(&other, &whole(7), true).1, 0);
    }

    #[test]
    fn the_least_recently_used_chunk_goes_first_past_the_budget() {
        let one = chunk(&[1, 2, 3, 4]).nbytes() as u64 + 16;
        let mut cache = ChunkCache::new(2 * one);
        cache.store(&[1, 2, 3, 4], 0, chunk(&[1, 2, 3, 4]));
        cache.store(&[5, 6, 7, 8], 0, chunk(&[5, 6, 7, 8]));
        // Using the first makes the second the oldest.
        assert_eq!(cache.restore(&[1, 2, 3, 4, 0], &whole(5), false).1, 4);
        cache.store(&[9, 10, 11, 12], 0, chunk(&[9, 10, 11, 12]));
        assert!(cache.bytes <= 2 * one);
        assert_eq!(cache.restore(&[1, 2, 3, 4, 0], &whole(5), false).1, 4);
        assert_eq!(cache.restore(&[5, 6, 7, 8, 0], &whole(5), false).1, 0);
        // A budget of 0 keeps nothing.
        let mut off = ChunkCache::new(0);
        off.store(&[1, 2, 3, 4], 0, chunk(&[1, 2, 3, 4]));
        assert_eq!(off.restore(&[1, 2, 3, 4, 0], &whole(5), false).1, 0);
    }
}
