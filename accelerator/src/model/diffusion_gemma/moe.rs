//! The mixture-of-experts branch: router on the raw residual, top-k experts, GeGLU experts.

use mlx_rs::{ops, Array, Dtype};

use super::{dispatch::Dispatch, experts::Experts};
use crate::model::{fused, linear::Linear, norm::RmsNorm, widened, ModelError};

/// (token, expert) pairs from which the expert dispatch is sorted by expert (mlx-lm's SwitchGLU
/// uses the same figure).
pub const SORT_THRESHOLD: i32 = 64;

/// Rows of each expert product when float32 experts run grouped on the CPU
/// ([`Moe::tiled_on_host`]): a pair's row is always computed in a product of this many rows.
/// Measured on OpenBLAS 0.3.21 (Haswell kernels): a row's bits did not depend on its place or
/// its neighbours in products of 4 or 8 rows for every shape tried (32 to 2816 inputs), but
/// did in products of 16 rows with 128 inputs or fewer; 8 rows took the `small` preset's
/// float32 prefill from ~530 to ~200 ms (docs/benchmarks.md, "The small preset's drift").
pub const TILE_ROWS: usize = 8;

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
    /// On MLX's CPU backend, dense experts are grouped on the host instead: bfloat16 ones in
    /// one product per chosen expert over all its tokens ([`Moe::grouped_on_host`]), float32
    /// ones in products of [`TILE_ROWS`] rows ([`Moe::tiled_on_host`]).
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
        let tiled = match grouped {
            Some(_) => None,
            None => match (
                self.gate_up.cpu_float32_stack()?,
                self.down.cpu_float32_stack()?,
            ) {
                (Some(gate_up), Some(down)) => {
                    Some(self.tiled_on_host(e_in, &idx, segments, gate_up, down, TILE_ROWS)?)
                }
                _ => None,
            },
        };
        let y = if let Some(y) = grouped.or(tiled) {
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

    /// The experts' outputs `[N·k, hidden]` in (token, slot) order for float32 stacks on MLX's
    /// CPU backend: the router's choice is read on the host, the pairs grouped by segment and
    /// expert ([`Dispatch`]) and laid out in tiles of `tile_rows` rows, a run's last tile
    /// padded with a zero row; one `gather_mm` then runs one product of `tile_rows` rows per
    /// tile, with the tile's expert.
    ///
    /// Why tiles of a fixed size: MLX's CPU `gather_mm` otherwise runs one single-row product
    /// per pair (OpenBLAS's small-matrix kernel took the largest share of a float32 pass on the
    /// `small` preset), but a product over all the pairs that chose an expert would make a
    /// pair's bits depend on how many others chose it, because OpenBLAS rounds a row of a
    /// product differently with the product's row count (`grouped_on_host`). With every
    /// product `tile_rows` rows, a row's sum is the same whatever shares its tile, and where in
    /// the tile it lands (`tests::a_pair_gets_the_same_bits_whatever_shares_its_tiles`
    /// checks both on OpenBLAS).
    fn tiled_on_host(
        &self,
        e_in: &Array,
        idx: &Array,
        segments: &[i32],
        gate_up: &Array,
        down: &Array,
        tile_rows: usize,
    ) -> Result<Array, ModelError> {
        let dtype = e_in.dtype();
        let (n, hidden) = (e_in.dim(0), e_in.dim(1));
        let k = idx.dim(1);
        let chosen = idx.contiguous()?;
        let chosen = chosen
            .try_as_slice::<u32>()
            .map_err(|e| ModelError::RouterChoice(e.to_string()))?;
        let experts = gate_up.dim(0).min(down.dim(0)).max(0) as usize;
        let dispatch = Dispatch::new(chosen, k as usize, experts, segments)?;
        let tiles = dispatch.tiles(tile_rows, n as u32);
        let pairs = dispatch.tokens.len() as i32;
        let count = tiles.experts.len() as i32;
        if count == 0 {
            return Ok(ops::zeros_dtype(&[0, hidden], dtype)?);
        }
        let rows = tile_rows as i32;
        // Row `n` is the zero row the padding points at.
        let padded = ops::concatenate(
            &[
                e_in.as_dtype(Dtype::Float32)?,
                ops::zeros::<f32>(&[1, hidden])?,
            ],
            0,
        )?;
        let x = padded
            .take_axis(Array::from_slice(&tiles.rows, &[count * rows]), 0)?
            .reshape(&[count, rows, hidden])?;
        let which = Array::from_slice(&tiles.experts, &[count]);
        widened::note_native(&[gate_up]);
        widened::note_native(&[down]);
        let act = self.activation(&ops::gather_mm(
            &x,
            &gate_up.swap_axes(-1, -2)?,
            None,
            &which,
            false,
        )?)?;
        let y = ops::gather_mm(&act, &down.swap_axes(-1, -2)?, None, &which, false)?
            .reshape(&[count * rows, hidden])?;
        Ok(y.take_axis(Array::from_slice(&tiles.back, &[pairs]), 0)?
            .as_dtype(dtype)?)
    }

    /// GeGLU of the fused gate+up output (`[…, 2I]` → `[…, I]`).
    fn activation(&self, gate_up: &Array) -> Result<Array, ModelError> {
        let mut parts = gate_up.split_at_indices(&[self.moe_intermediate_size], -1)?;
        let up = parts.pop().ok_or(ModelError::Shape("gate_up split"))?;
        let gate = parts.pop().ok_or(ModelError::Shape("gate_up split"))?;
        fused::geglu(&gate, &up)
    }
}

#[cfg(test)]
mod tests {
    use mlx_rs::{ops, random, Array, Dtype};

    use super::*;

    fn moe(dtype: Dtype) -> Result<Moe, ModelError> {
        moe_of(dtype, 6, 32, 16, 2)
    }

    fn moe_of(
        dtype: Dtype,
        experts: i32,
        hidden: i32,
        inner: i32,
        k: i32,
    ) -> Result<Moe, ModelError> {
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
    /// float32 sum can round to the neighbouring bfloat16. Float32 experts, in tiles, give
    /// them to a few float32 roundings.
    #[test]
    fn experts_grouped_on_the_host_match_the_per_pair_products() -> Result<(), ModelError> {
        if !widened::cpu_backend()? {
            return Ok(());
        }
        for (dtype, tolerance) in [(Dtype::Bfloat16, 1.0 / 64.0), (Dtype::Float32, 1e-5)] {
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

    /// Float32 experts on the CPU run in tiles of a fixed row count (`Moe::tiled_on_host`): a
    /// pair's expert output is the same bits whatever else is in its segment — other tokens, how
    /// many of them chose its experts (copies of it fill its experts' tiles and spill into
    /// more), where it lands in a tile — on OpenBLAS, whose rounding of a row depends on the
    /// product's shape, when it can be loaded (else on the BLAS there is, saying so). The
    /// routing is fixed here: the router's own product is a dense product over the segment's
    /// rows, which on OpenBLAS depends on the segment's shape like every other dense product
    /// (docs/batching.md), so a whole layer's bits are a property of the segment, not the pair.
    #[test]
    fn a_pair_gets_the_same_bits_whatever_shares_its_tiles() -> Result<(), ModelError> {
        use crate::blas::{self, ActiveBlas, BlasChoice};
        if !widened::cpu_backend()? {
            return Ok(());
        }
        // An explicit HUNCH_BLAS=reference is kept; otherwise this process's BLAS is OpenBLAS
        // (what `auto` picks anyway where it is installed).
        let active = match blas::choice_from_env() {
            Ok(BlasChoice::Reference) => blas::active(),
            _ => blas::select(BlasChoice::OpenBlas).unwrap_or_else(|e| {
                eprintln!("OpenBLAS not used ({e})");
                blas::active()
            }),
        };
        if active != ActiveBlas::OpenBlas {
            eprintln!(
                "this check runs on the {active} BLAS, not OpenBLAS: it shows the tiles keep \
                 rows apart, not that OpenBLAS's shape-dependent rounding is avoided"
            );
        }
        // Products of 128 inputs and 128 or 64 outputs: OpenBLAS rounds such rows differently
        // with the row count (docs/checkpoint-layouts.md). 4 experts, 2 per token.
        let (experts, hidden, k) = (4u32, 128, 2);
        let m = moe_of(Dtype::Float32, experts as i32, hidden, 64, k)?;
        let (Some(gate_up), Some(down)) =
            (m.gate_up.cpu_float32_stack()?, m.down.cpu_float32_stack()?)
        else {
            return Err(ModelError::Shape("float32 test experts not tiled"));
        };
        let token = random::normal::<f32>(&[1, hidden][..], None, None, &random::key(21)?)?;
        let others = random::normal::<f32>(&[40, hidden][..], None, None, &random::key(22)?)?;
        // The token chooses experts 1 and 3; the others a fixed pseudo-random pair each.
        let other_choice = |i: usize| [(i * 7 % 4) as u32, ((i * 7 + 1 + i % 3) % 4) as u32];
        // The token's two expert outputs, with `before` other tokens ahead of it, `copies` of it
        // right after it and `after` other tokens after those.
        let outputs_of =
            |before: usize, copies: usize, after: usize| -> Result<Array, ModelError> {
                let mut rows = Vec::new();
                let mut choice = Vec::new();
                if before > 0 {
                    rows.push(others.split_at_indices(&[before as i32], 0)?.swap_remove(0));
                }
                choice.extend((0..before).flat_map(other_choice));
                rows.extend(std::iter::repeat_n(token.clone(), 1 + copies));
                choice.extend(std::iter::repeat_n([1, 3], 1 + copies).flatten());
                if after > 0 {
                    let start = (40 - after) as i32;
                    rows.push(others.split_at_indices(&[start], 0)?.swap_remove(1));
                }
                choice.extend((40 - after..40).flat_map(other_choice));
                let h = ops::concatenate(&rows, 0)?;
                let n = h.dim(0);
                let idx = Array::from_slice(&choice, &[n, k]);
                let y = m.tiled_on_host(&h, &idx, &[n], gate_up, down, TILE_ROWS)?;
                let at = Array::from_slice(&[before as i32 * k, before as i32 * k + 1], &[2]);
                Ok(y.take_axis(&at, 0)?)
            };
        let alone = outputs_of(0, 0, 0)?;
        let mut checked = 0;
        for (before, after) in [(0, 40), (40, 0), (13, 27), (3, 0), (7, 5), (31, 9)] {
            for copies in [0, 1, 2 * TILE_ROWS + 3] {
                let got = outputs_of(before, copies, after)?;
                let same = ops::array_eq(&got, &alone, None)?.item_exact::<bool>();
                assert!(
                    same,
                    "{active} BLAS: a pair's expert output moved with {before} tokens before \
                     it, {copies} copies of it and {after} tokens after"
                );
                checked += 1;
            }
        }
        // Whether this BLAS would have moved the bits of a product over all the rows (what
        // the tiles avoid): shown, not asserted, since it depends on the BLAS and the CPU.
        let w = random::normal::<f32>(&[64, hidden][..], None, 0.1, &random::key(23)?)?;
        let many = ops::concatenate(&[others.clone(), token.clone()], 0)?;
        let one = ops::matmul(&token, w.t())?.reshape(&[64])?;
        let last = ops::matmul(&many, w.t())?.take_axis(Array::from_int(40), 0)?;
        let moved = !ops::array_eq(&one, &last, None)?.item_exact::<bool>();
        eprintln!(
            "{active} BLAS: {checked} segments gave the pair the same bits; a row alone and \
             the last row of a 41-row product {}",
            if moved { "differ" } else { "agree" }
        );
        Ok(())
    }
}
