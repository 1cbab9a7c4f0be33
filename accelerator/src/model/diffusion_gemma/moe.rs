//! The mixture-of-experts branch: router on the raw residual, top-k experts, GeGLU experts.

use mlx_rs::{ops, Array, Dtype};

use super::experts::Experts;
use crate::model::{fused, linear::Linear, norm::RmsNorm, widened, ModelError};

/// (token, expert) pairs from which the expert dispatch is sorted by expert (mlx-lm's SwitchGLU
/// uses the same figure).
pub const SORT_THRESHOLD: i32 = 64;

/// Picks `top_k` experts per token and their weights.
#[derive(Clone, Debug)]
pub struct Router {
    proj: Linear,
    scale: Array,
    per_expert_scale: Array,
    norm: RmsNorm,
    hidden_size: i32,
    top_k: i32,
}

impl Router {
    /// `proj` `[E, hidden]`, `scale` `[hidden]`, `per_expert_scale` `[E]`.
    pub fn new(
        proj: Linear,
        scale: Array,
        per_expert_scale: Array,
        eps: f32,
        hidden_size: i32,
        top_k: i32,
    ) -> Self {
        Self {
            proj,
            scale,
            per_expert_scale,
            norm: RmsNorm::no_scale(eps),
            hidden_size,
            top_k,
        }
    }

    /// `h` `[N, hidden]` (the *un-normalised* residual) → (expert ids uint32 `[N, k]`, weights
    /// float32 `[N, k]`).
    pub fn route(&self, h: &Array) -> Result<(Array, Array), ModelError> {
        let dtype = h.dtype();
        let r = self.norm.forward(h)?;
        let r = ops::multiply(r, &self.scale)?;
        let r = ops::multiply(
            r,
            fused::constant((self.hidden_size as f32).powf(-0.5), dtype)?,
        )?;
        let scores = self.proj.forward(&r)?.as_dtype(Dtype::Float32)?;
        let probs = ops::softmax_axis(&scores, -1, true)?;
        // argpartition on the negated probabilities puts the k largest first (in any order; the
        // weighted sum does not depend on it).
        let k = self.top_k;
        let order = ops::argpartition_axis(ops::negative(&probs)?, k - 1, -1)?;
        let n = h.dim(0);
        let idx = order.split_at_indices(&[k], -1)?.swap_remove(0);
        let top = probs.take_along_axis(&idx, -1)?;
        let top = ops::divide(&top, top.sum_axis(-1, true)?)?;
        let pes = self
            .per_expert_scale
            .as_dtype(Dtype::Float32)?
            .take_axis(&idx, 0)?;
        let weights = ops::multiply(top, pes)?;
        let idx = idx.as_dtype(Dtype::Uint32)?.reshape(&[n, k])?;
        Ok((idx, weights))
    }
}

/// The MoE branch of a layer.
#[derive(Clone, Debug)]
pub struct Moe {
    router: Router,
    /// Fused gate+up `[E, 2·I, hidden]`: rows `0..I` gate, `I..2I` up.
    gate_up: Experts,
    /// `[E, hidden, I]`.
    down: Experts,
    moe_intermediate_size: i32,
}

impl Moe {
    /// From the router and the two expert stacks.
    pub fn new(
        router: Router,
        gate_up: Experts,
        down: Experts,
        moe_intermediate_size: i32,
    ) -> Self {
        Self {
            router,
            gate_up,
            down,
            moe_intermediate_size,
        }
    }

    /// `h` is the raw residual `[N, hidden]` (routes), `e_in` the pre-normed expert input
    /// `[N, hidden]`; returns `Σ_k weight_k · expert_k(e_in)` `[N, hidden]`.
    ///
    /// From [`SORT_THRESHOLD`] (token, expert) pairs on, the pairs are sorted by expert before
    /// the expert matmuls and put back in token order after them, as mlx-lm's SwitchGLU does:
    /// each pair's product is the same computation either way, but a GPU then runs grouped
    /// GEMMs instead of one matrix-vector product per pair.
    ///
    /// On MLX's CPU backend, dense bfloat16 experts are grouped on the host instead
    /// ([`Moe::grouped_on_host`]): one product per chosen expert over all its tokens.
    ///
    /// `segments` are the row counts of the segments laid end to end in `h` (a prompt chunk, a
    /// read's canvases; `Attention::forward`), summing to N: grouped products never mix rows of
    /// two segments, so a segment's outputs do not depend on what shares its pass.
    pub fn forward(&self, h: &Array, e_in: &Array, segments: &[i32]) -> Result<Array, ModelError> {
        let dtype = e_in.dtype();
        let (idx, weights) = self.router.route(h)?;
        let n = e_in.dim(0);
        let k = idx.dim(1);
        let hidden = e_in.dim(1);
        let grouped = match (
            self.gate_up.cpu_dense_matrices()?,
            self.down.cpu_dense_matrices()?,
        ) {
            (Some(gate_up), Some(down)) => {
                Some(self.grouped_on_host(e_in, &idx, segments, &gate_up, &down)?)
            }
            _ => None,
        };
        let y = if let Some(y) = grouped {
            y
        } else if n * k >= SORT_THRESHOLD {
            let flat = idx.flatten(None, None)?;
            let order = ops::argsort_axis(&flat, 0)?;
            let back = ops::argsort_axis(&order, 0)?;
            let token = ops::floor_divide(&order, fused::constant(k as f32, order.dtype())?)?;
            let x = e_in.take_axis(&token, 0)?.reshape(&[n * k, 1, hidden])?;
            let sorted = flat.take_axis(&order, 0)?;
            let act = self.activation(&self.gate_up.forward_sorted(&x, &sorted)?)?;
            let y = self.down.forward_sorted(&act, &sorted)?; // [N·k, 1, hidden]
            y.take_axis(&back, 0)?
        } else {
            let x = e_in.reshape(&[n, 1, 1, hidden])?;
            let act = self.activation(&self.gate_up.forward(&x, &idx)?)?; // [N, k, 1, I]
            self.down.forward(&act, &idx)? // [N, k, 1, hidden]
        };
        let y = y.reshape(&[n, k, hidden])?;
        let w = weights.as_dtype(dtype)?.expand_dims(-1)?;
        Ok(ops::multiply(y, w)?.sum_axis(1, false)?)
    }

    /// The experts' outputs `[N·k, hidden]` in (token, slot) order, computed one expert at a
    /// time: the router's choice is read on the host, the pairs grouped by segment and expert
    /// ([`Dispatch`]), and each chosen expert's `gate_up` and `down` run as one product each
    /// over all its tokens of the segment (`widened::dense_matmul`: a bfloat16 matrix widened
    /// per call in cache-sized slices). Each pair's output is the same sum over the same values
    /// as in `gather_mm`'s per-pair product; only the number of rows of the product changes.
    ///
    /// Per segment, because some BLAS (OpenBLAS) round a row differently depending on how many
    /// rows the product has (measured: the rows of a 128 × 64 product change their last bits
    /// once it has 10 rows or more): grouped over the whole pass, a prompt chunk's K/V would
    /// depend on whether another chunk or read shared its pass, and a warm prefix cache would
    /// no longer give the cold answer's bits (docs/batching.md).
    ///
    /// Reading the choice blocks until this layer's routing is computed. The CPU computes the
    /// pass in order either way; what is lost is building the rest of the graph while this
    /// layer computes, small next to a layer's products (docs/benchmarks.md, "Experts grouped
    /// by expert", has the `small` preset, where it shows most). The experts run one after the
    /// other (each one's input waits for the previous one's
    /// output): otherwise MLX's breadth-first order would widen every expert's first slice at
    /// once.
    fn grouped_on_host(
        &self,
        e_in: &Array,
        idx: &Array,
        segments: &[i32],
        gate_up: &[Array],
        down: &[Array],
    ) -> Result<Array, ModelError> {
        let k = idx.dim(1);
        let chosen = idx.contiguous()?;
        let chosen = chosen
            .try_as_slice::<u32>()
            .map_err(|e| ModelError::RouterChoice(e.to_string()))?;
        let dispatch = Dispatch::new(chosen, k as usize, gate_up.len().min(down.len()), segments)?;
        let pairs = dispatch.tokens.len() as i32;
        let x = e_in.take_axis(Array::from_slice(&dispatch.tokens, &[pairs]), 0)?;
        let bounds = dispatch.run_bounds();
        let parts = if bounds.is_empty() {
            vec![x.clone()]
        } else {
            x.split_at_indices(&bounds, 0)?
        };
        // One widened product per stack, as one `gather_mm` counts (`take_product_paths`).
        widened::note(widened::Path::Widened);
        widened::note(widened::Path::Widened);
        let mut previous = x;
        let mut outputs = Vec::with_capacity(parts.len());
        for (&(expert, _), part) in dispatch.runs.iter().zip(&parts) {
            let expert = expert as usize;
            let part = widened::after(part, &previous)?;
            let act = self.activation(&widened::dense_matmul_uncounted(
                &part,
                &gate_up[expert],
                true,
            )?)?;
            let y = widened::dense_matmul_uncounted(&act, &down[expert], true)?;
            previous = y.clone();
            outputs.push(y);
        }
        let grouped = if outputs.len() == 1 {
            outputs.swap_remove(0)
        } else {
            ops::concatenate(&outputs, 0)?
        };
        Ok(grouped.take_axis(Array::from_slice(&dispatch.back, &[pairs]), 0)?)
    }

    /// GeGLU of the fused gate+up output (`[…, 2I]` → `[…, I]`).
    fn activation(&self, gate_up: &Array) -> Result<Array, ModelError> {
        let mut parts = gate_up.split_at_indices(&[self.moe_intermediate_size], -1)?;
        let up = parts.pop().ok_or(ModelError::Shape("gate_up split"))?;
        let gate = parts.pop().ok_or(ModelError::Shape("gate_up split"))?;
        fused::geglu(&gate, &up)
    }
}

/// The (token, expert) pairs of one MoE layer grouped by segment and expert, worked out on the
/// host from the router's choice.
#[derive(Debug, PartialEq, Eq)]
struct Dispatch {
    /// Each pair's token row, pairs in grouped order (by segment, expert, then token and slot).
    tokens: Vec<u32>,
    /// For each pair in (token, slot) order, its place in grouped order.
    back: Vec<u32>,
    /// Each segment's chosen experts and how many pairs each has, segment by segment, experts
    /// ascending within a segment.
    runs: Vec<(u32, i32)>,
}

impl Dispatch {
    /// From the expert ids in (token, slot) order, `k` per token, `experts` in the stack, and
    /// the row counts of the segments laid end to end (summing to the tokens).
    fn new(chosen: &[u32], k: usize, experts: usize, segments: &[i32]) -> Result<Self, ModelError> {
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
    fn run_bounds(&self) -> Vec<i32> {
        self.runs
            .iter()
            .scan(0, |end, &(_, c)| {
                *end += c;
                Some(*end)
            })
            .take(self.runs.len().saturating_sub(1))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use mlx_rs::{ops, random, Array, Dtype};

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

    fn moe(dtype: Dtype) -> Result<Moe, ModelError> {
        let (experts, hidden, inner, k) = (6, 32, 16, 2);
        let normal = |shape: &[i32], seed: u64| -> Result<Array, ModelError> {
            Ok(random::normal::<f32>(shape, None, 0.1, &random::key(seed)?)?.as_dtype(dtype)?)
        };
        let router = Router::new(
            Linear::dense(normal(&[experts, hidden], 1)?),
            ops::ones::<f32>(&[hidden])?.as_dtype(dtype)?,
            ops::ones::<f32>(&[experts])?.as_dtype(dtype)?,
            1e-6,
            hidden,
            k,
        );
        Ok(Moe::new(
            router,
            Experts::dense(normal(&[experts, 2 * inner, hidden], 2)?)?,
            Experts::dense(normal(&[experts, hidden, inner], 3)?)?,
            inner,
        ))
    }

    /// Grouped on the host, bfloat16 experts give the outputs of the per-pair `gather_mm` path
    /// (which widens the whole stack) to about one bfloat16 rounding: the float32 sums may
    /// round differently with the number of rows of a product on some BLAS, and a different
    /// float32 sum can round to the neighbouring bfloat16.
    #[test]
    fn experts_grouped_on_the_host_match_the_per_pair_products() -> Result<(), ModelError> {
        if !widened::cpu_backend()? {
            return Ok(());
        }
        for (dtype, tolerance) in [(Dtype::Bfloat16, 1.0 / 64.0)] {
            let m = moe(dtype)?;
            for segments in [&[1][..], &[5], &[25, 15]] {
                let tokens: i32 = segments.iter().sum();
                let h = random::normal::<f32>(&[tokens, 32][..], None, None, &random::key(9)?)?
                    .as_dtype(dtype)?;
                let got = m.forward(&h, &h, segments)?;
                assert_eq!(got.dtype(), dtype);
                // The per-pair path: `gather_mm` over the same routing.
                let (idx, weights) = m.router.route(&h)?;
                let x = h.reshape(&[tokens, 1, 1, 32])?;
                let act = m.activation(&m.gate_up.forward(&x, &idx)?)?;
                let y = m.down.forward(&act, &idx)?.reshape(&[tokens, 2, 32])?;
                let want = ops::multiply(y, weights.as_dtype(dtype)?.expand_dims(-1)?)?
                    .sum_axis(1, false)?;
                let wide = |a: &Array| a.as_dtype(Dtype::Float32);
                let d = ops::abs(ops::subtract(wide(&got)?, wide(&want)?)?)?
                    .max(None)?
                    .item_exact::<f32>();
                let scale = ops::abs(wide(&want)?)?.max(None)?.item_exact::<f32>();
                assert!(scale > 0.0);
                assert!(
                    d <= tolerance * scale,
                    "{dtype:?}, segments {segments:?}: grouped vs per pair {d} (max {scale})"
                );
            }
        }
        Ok(())
    }

    /// A segment's outputs are the same bits alone and beside another segment in one pass,
    /// whatever the BLAS: its rows are never grouped with another segment's.
    #[test]
    fn a_segment_gets_the_same_bits_alone_and_sharing_a_pass() -> Result<(), ModelError> {
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            let m = moe(dtype)?;
            let h = random::normal::<f32>(&[30, 32][..], None, None, &random::key(11)?)?
                .as_dtype(dtype)?;
            let shared = m.forward(&h, &h, &[12, 18])?;
            let parts = h.split_at_indices(&[12], 0)?;
            let alone = ops::concatenate(
                &[
                    m.forward(&parts[0], &parts[0], &[12])?,
                    m.forward(&parts[1], &parts[1], &[18])?,
                ],
                0,
            )?;
            let same = ops::array_eq(&shared, &alone, None)?.item_exact::<bool>();
            assert!(
                same,
                "{dtype:?}: a segment's MoE outputs changed when sharing a pass"
            );
        }
        Ok(())
    }
}
