//! The mixture-of-experts branch: router on the raw residual, top-k experts, GeGLU experts.

use mlx_rs::{ops, Array, Dtype};

use super::{experts::Experts, fused, linear::Linear, norm::RmsNorm, ModelError};

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
    pub fn forward(&self, h: &Array, e_in: &Array) -> Result<Array, ModelError> {
        let dtype = e_in.dtype();
        let (idx, weights) = self.router.route(h)?;
        let n = e_in.dim(0);
        let k = idx.dim(1);
        let hidden = e_in.dim(1);
        let y = if n * k >= SORT_THRESHOLD {
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

    /// GeGLU of the fused gate+up output (`[…, 2I]` → `[…, I]`).
    fn activation(&self, gate_up: &Array) -> Result<Array, ModelError> {
        let mut parts = gate_up.split_at_indices(&[self.moe_intermediate_size], -1)?;
        let up = parts.pop().ok_or(ModelError::Shape("gate_up split"))?;
        let gate = parts.pop().ok_or(ModelError::Shape("gate_up split"))?;
        fused::geglu(&gate, &up)
    }
}
