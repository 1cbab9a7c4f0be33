//! What both families' prompt chunks share: a layer's keys and values, and the masks of one
//! chunk (the unit of prefix sharing: its computation's shapes depend only on its position, so
//! restored and recomputed chunks give the same bits; docs/batching.md).

use mlx_rs::Array;

/// Keys and values of prompt positions for one layer, `[1, kv_heads, T, head_dim]` each (already
/// normed and rotated): one prompt chunk's, or a whole prompt's (sliding layers: only its last
/// `sliding_window - 1` positions).
#[derive(Clone, Debug)]
pub struct LayerKv {
    /// Keys.
    pub keys: Array,
    /// Values.
    pub values: Array,
}

/// The attention masks of one prompt chunk, made once per chunk and shared by its layers.
///
/// Full layers attend to every earlier chunk, causally: exactly MLX's `causal` attention mode
/// (query `i` sees keys up to `i + keys − queries`), so no mask array is built for them.
/// Sliding layers take only the trailing earlier chunks that cover the window
/// (`sliding_first..`), so the shapes of a chunk's computation depend on the chunk's index alone
/// and its K/V are the same bits whether the earlier chunks were computed now or restored from
/// the prefix cache; their mask is materialised only where the window cuts a query's keys.
#[derive(Debug)]
pub struct ChunkMasks {
    /// Index of the first earlier chunk a sliding layer uses.
    sliding_first: usize,
    /// `[1, 1, c, used past + c]`: key at or before the query, and within `window` of it;
    /// `None` where that is plain causal (no query has a key outside its window).
    sliding: Option<Array>,
}

impl ChunkMasks {
    /// Index of the first earlier chunk a sliding layer attends to.
    pub fn sliding_first(&self) -> usize {
        self.sliding_first
    }

    /// The sliding layers' mask, where the window cuts some query's keys.
    pub fn sliding_mask(&self) -> Option<&Array> {
        self.sliding.as_ref()
    }

    /// For a chunk of `len` tokens starting at `start`, after earlier chunks of `past_lens`
    /// tokens (in order), with a sliding window of `window`.
    pub fn new(start: i32, past_lens: &[i32], len: i32, window: i32) -> Self {
        let (sliding_first, covered) = sliding_span(past_lens, window);
        let mask = |key_start: i32| {
            let total = start + len - key_start;
            let bits: Vec<bool> = (0..len)
                .flat_map(|i| {
                    let query = start + i;
                    (0..total).map(move |j| {
                        let key = key_start + j;
                        key <= query && query - key < window
                    })
                })
                .collect();
            Array::from_slice(&bits, &[1, 1, len, total])
        };
        // The last query's earliest key is `covered + len − 1` positions back.
        let windowed = covered + len > window;
        ChunkMasks {
            sliding_first,
            sliding: windowed.then(|| mask(start - covered)),
        }
    }
}

/// The first earlier chunk a sliding layer with `window` attends to, after earlier chunks of
/// `past_lens` tokens, and the tokens those trailing chunks cover: the fewest trailing chunks
/// that hold the `window − 1` keys before the chunk (all of them if fewer).
pub fn sliding_span(past_lens: &[i32], window: i32) -> (usize, i32) {
    let mut covered = 0;
    let mut first = past_lens.len();
    while first > 0 && covered < window - 1 {
        first -= 1;
        covered += past_lens[first];
    }
    (first, covered)
}

#[cfg(test)]
mod tests {
    use super::ChunkMasks;

    fn rows(mask: &mlx_rs::Array) -> Vec<String> {
        let (c, t) = (mask.dim(2) as usize, mask.dim(3) as usize);
        let bits = mask.as_slice::<bool>();
        (0..c)
            .map(|i| {
                bits[i * t..(i + 1) * t]
                    .iter()
                    .map(|&b| if b { '1' } else { '.' })
                    .collect()
            })
            .collect()
    }

    fn sliding(m: &ChunkMasks) -> Vec<String> {
        rows(m.sliding.as_ref().expect("a windowed mask"))
    }

    #[test]
    fn the_first_chunk_is_plain_causal_and_windowed() {
        let m = ChunkMasks::new(0, &[], 4, 3);
        // Window 3: a query sees itself and the two before it.
        assert_eq!(sliding(&m), ["1...", "11..", "111.", ".111"]);
        assert_eq!(m.sliding_first, 0);
        // A window the chunk fits in is plain causal: no mask array at all.
        assert!(ChunkMasks::new(0, &[], 4, 4).sliding.is_none());
    }

    #[test]
    fn a_later_chunk_sees_only_the_window_on_sliding_layers() {
        // Chunks of 4; this is chunk 2 (positions 8..12) with window 6: sliding layers need the
        // 5 keys before position 8, more than chunk 1 holds, so both earlier chunks.
        let m = ChunkMasks::new(8, &[4, 4], 4, 6);
        assert_eq!(m.sliding_first, 0);
        // Query 8 sees keys 3..=8; query 11 sees keys 6..=11.
        assert_eq!(sliding(&m)[0], "...111111...");
        assert_eq!(sliding(&m)[3], "......111111");
        // Window 4: 3 keys before position 8 are needed; chunk 1 covers them alone.
        let m = ChunkMasks::new(8, &[4, 4], 4, 4);
        assert_eq!(m.sliding_first, 1);
        assert_eq!(
            m.sliding.as_ref().map(|a| a.shape().to_vec()),
            Some(vec![1, 1, 4, 8])
        );
        assert_eq!(sliding(&m)[0], ".1111...");
        assert_eq!(sliding(&m)[3], "....1111");
    }
}
