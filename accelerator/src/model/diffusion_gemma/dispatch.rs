//! Where each (token, expert) pair of a MoE layer goes when the experts run grouped on the host
//! (MLX's CPU backend; `Moe::forward`): worked out from the router's choice, read back from the
//! graph.

use crate::model::ModelError;

/// The (token, expert) pairs of one MoE layer grouped by segment and expert, worked out on the
/// host from the router's choice.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Dispatch {
    /// Each pair's token row, pairs in grouped order (by segment, expert, then token and slot).
    pub(super) tokens: Vec<u32>,
    /// For each pair in (token, slot) order, its place in grouped order.
    pub(super) back: Vec<u32>,
    /// Each segment's chosen experts and how many pairs each has, segment by segment, experts
    /// ascending within a segment.
    pub(super) runs: Vec<(u32, i32)>,
}

impl Dispatch {
    /// From the expert ids in (token, slot) order, `k` per token, `experts` in the stack, and
    /// the row counts of the segments laid end to end (summing to the tokens).
    pub(super) fn new(
        chosen: &[u32],
        k: usize,
        experts: usize,
        segments: &[i32],
    ) -> Result<Self, ModelError> {
        let k = k.max(1);
        let rows: usize = segments.iter().map(|&r| r.max(0) as usize).sum();
        if rows * k != chosen.len() {
            return Err(ModelError::Shape(
                "the segments' rows do not match the router's choice",
            ));
        }
        let mut tokens = vec![0u32; chosen.len()];
        let mut back = vec![0u32; chosen.len()];
        let mut runs = Vec::new();
        let mut first_pair = 0usize;
        for &segment_rows in segments {
            let pairs = first_pair..first_pair + segment_rows.max(0) as usize * k;
            let mut counts = vec![0usize; experts];
            for &e in &chosen[pairs.clone()] {
                *counts.get_mut(e as usize).ok_or(ModelError::Shape(
                    "the router chose an expert outside the stack",
                ))? += 1;
            }
            // Each expert's first place in grouped order.
            let mut next = Vec::with_capacity(experts);
            let mut place = first_pair;
            for &c in &counts {
                next.push(place);
                place += c;
            }
            for pair in pairs.clone() {
                let e = chosen[pair] as usize;
                tokens[next[e]] = (pair / k) as u32;
                back[pair] = next[e] as u32;
                next[e] += 1;
            }
            runs.extend(
                counts
                    .iter()
                    .enumerate()
                    .filter(|(_, &c)| c > 0)
                    .map(|(e, &c)| (e as u32, c as i32)),
            );
            first_pair = pairs.end;
        }
        Ok(Self { tokens, back, runs })
    }

    /// Where the grouped pairs split into runs (every run's start but the first).
    pub(super) fn run_bounds(&self) -> Vec<i32> {
        self.runs
            .iter()
            .scan(0, |end, &(_, c)| {
                *end += c;
                Some(*end)
            })
            .take(self.runs.len().saturating_sub(1))
            .collect()
    }

    /// The grouped pairs laid out in products of `tile_rows` rows each: every run (one
    /// segment's pairs for one expert) fills as many tiles as it needs, its last tile padded
    /// with the row `pad` (the caller's zero row). Each product then has the same shape
    /// whatever the run's length, so a pair's row is summed the same way whatever else chose
    /// its expert (`Moe::tiled_on_host` says why that matters).
    pub(super) fn tiles(&self, tile_rows: usize, pad: u32) -> Tiles {
        let tile_rows = tile_rows.max(1);
        let mut rows = Vec::new();
        let mut experts = Vec::new();
        // Each grouped place's row in the tiles.
        let mut placed = vec![0u32; self.tokens.len()];
        let mut first = 0usize;
        for &(expert, count) in &self.runs {
            let count = count.max(0) as usize;
            for (i, place) in placed[first..first + count].iter_mut().enumerate() {
                *place = (rows.len() + i) as u32;
            }
            rows.extend_from_slice(&self.tokens[first..first + count]);
            let tiles = count.div_ceil(tile_rows);
            rows.resize(rows.len() + tiles * tile_rows - count, pad);
            experts.resize(experts.len() + tiles, expert);
            first += count;
        }
        let back = self.back.iter().map(|&g| placed[g as usize]).collect();
        Tiles {
            rows,
            experts,
            back,
        }
    }
}

/// The grouped pairs of a [`Dispatch`] in tiles of a fixed row count ([`Dispatch::tiles`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Tiles {
    /// Each tile row's token (or the pad row), tile after tile.
    pub(super) rows: Vec<u32>,
    /// Each tile's expert.
    pub(super) experts: Vec<u32>,
    /// For each pair in (token, slot) order, its row in the tiles.
    pub(super) back: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatch_groups_pairs_by_expert_and_puts_them_back() -> Result<(), ModelError> {
        // 3 tokens, 2 slots each, 4 experts (expert 2 unused).
        let chosen = [3u32, 0, 0, 1, 3, 1];
        let d = Dispatch::new(&chosen, 2, 4, &[3])?;
        // Grouped: expert 0 (pairs 1, 2), 1 (pairs 3, 5), 3 (pairs 0, 4).
        assert_eq!(d.runs, vec![(0, 2), (1, 2), (3, 2)]);
        assert_eq!(d.tokens, vec![0, 1, 1, 2, 0, 2]);
        assert_eq!(d.back, vec![4, 0, 1, 2, 5, 3]);
        assert_eq!(d.run_bounds(), vec![2, 4]);
        // Every pair's place holds its own token.
        for (pair, &place) in d.back.iter().enumerate() {
            assert_eq!(d.tokens[place as usize] as usize, pair / 2);
        }
        assert!(
            Dispatch::new(&[4], 1, 4, &[1]).is_err(),
            "expert outside the stack"
        );
        assert!(
            Dispatch::new(&[1, 2], 1, 4, &[1]).is_err(),
            "rows do not match"
        );
        let one = Dispatch::new(&[2, 2], 1, 4, &[2])?;
        assert_eq!((one.run_bounds(), one.runs), (vec![], vec![(2, 2)]));
        // Two segments (tokens 0-1, token 2): each grouped on its own, expert 3 twice.
        let two = Dispatch::new(&chosen, 2, 4, &[2, 1])?;
        assert_eq!(two.runs, vec![(0, 2), (1, 1), (3, 1), (1, 1), (3, 1)]);
        assert_eq!(two.tokens, vec![0, 1, 1, 0, 2, 2]);
        assert_eq!(two.back, vec![3, 0, 1, 2, 5, 4]);
        for (pair, &place) in two.back.iter().enumerate() {
            assert_eq!(two.tokens[place as usize] as usize, pair / 2);
        }
        Ok(())
    }

    #[test]
    fn tiles_have_a_fixed_row_count_and_put_pairs_back() -> Result<(), ModelError> {
        // 3 tokens, 2 slots; two segments (tokens 0-1, token 2), as in the test above.
        let chosen = [3u32, 0, 0, 1, 3, 1];
        let d = Dispatch::new(&chosen, 2, 4, &[2, 1])?;
        let t = d.tiles(2, 9);
        // Runs (0, 2), (1, 1), (3, 1) | (1, 1), (3, 1): one tile each, padded to 2 rows.
        assert_eq!(t.experts, vec![0, 1, 3, 1, 3]);
        assert_eq!(t.rows, vec![0, 1, 1, 9, 0, 9, 2, 9, 2, 9]);
        for (pair, &row) in t.back.iter().enumerate() {
            assert_eq!(t.rows[row as usize] as usize, pair / 2);
        }
        // A run longer than a tile takes several; every row of a tile has the tile's expert.
        let many = Dispatch::new(&[1, 1, 1, 1, 1], 1, 2, &[5])?.tiles(2, 7);
        assert_eq!(many.experts, vec![1, 1, 1]);
        assert_eq!(many.rows, vec![0, 1, 2, 3, 4, 7]);
        assert_eq!(many.back, vec![0, 1, 2, 3, 4]);
        assert_eq!(
            Dispatch::new(&[], 2, 4, &[])?.tiles(16, 0).rows,
            Vec::<u32>::new()
        );
        Ok(())
    }
}
