//! One prompt chunk through every layer on the native path: what `CausalLm::forward_chunk` and
//! the blocks compute on MLX (`blocks.rs`), in the same order, on float32 slices borrowed from
//! the loaded weights, with the products in the process's BLAS and the elementwise work in
//! [`super::kernels`].
//!
//! The cache's currency stays MLX arrays: the earlier chunks' K/V are read through `as_slice`
//! (restored or computed now, they are the same arrays), and this chunk's K/V leave as new
//! `[1, kv_heads, len, head_dim]` arrays, so the prefix cache and the engine do not change.

use mlx_rs::Array;

use crate::blas;
use crate::model::causal::blocks::DecoderLayer;
use crate::model::causal::config::Activation;
use crate::model::kv::{sliding_span, LayerKv};
use crate::model::norm::RmsNorm;
use crate::model::ModelError;

use super::attention::{attend, AttentionScratch, Heads, PastKv};
use super::kernels::{
    self,
    quant::{self, QuantizedRows},
};
use super::packed::{dense, Operand, Packed, Projection};
use super::rope::{heads_first, RopeTable};
use super::{PastChunk, Weights};

/// A norm's weight values (if it has one) and epsilon.
pub(super) fn norm_weight(norm: &RmsNorm) -> Result<Option<&[f32]>, ModelError> {
    norm.weight()
        .map(|w| {
            w.try_as_slice::<f32>()
                .map_err(|_| ModelError::Shape("a norm weight is not contiguous float32"))
        })
        .transpose()
}

/// `y = x · Wᵀ` for each `(W, y)` of `products`, `x` `[rows, in]`, each `W` `[out, in]`:
/// float32 weights in the BLAS, repacked quantised ones on the integer products. Projections of
/// the same input (q/k/v, gate/up) go together so that `x` is quantised once (into `quantized`).
fn project(
    x: &[f32],
    rows: usize,
    products: &mut [(Operand<'_>, &mut Vec<f32>)],
    quantized: &mut QuantizedRows,
) -> Result<(), ModelError> {
    let input = x.len().checked_div(rows).unwrap_or(0);
    if input == 0 || x.len() != rows * input {
        return Err(ModelError::Shape("a projection's input is not whole rows"));
    }
    let disagree = ModelError::Shape("a projection's input and weight disagree");
    let mut quantized_at = None;
    for (weight, y) in products.iter_mut() {
        match *weight {
            Operand::Int8(w, precision) => {
                if w.input() != input {
                    return Err(disagree);
                }
                let kernel_error = |e: quant::QuantError| ModelError::NativeKernels(e.to_string());
                if quantized_at != Some(precision) {
                    quantized
                        .quantize(x, rows, precision)
                        .map_err(kernel_error)?;
                    quantized_at = Some(precision);
                }
                y.resize(rows * w.out(), 0.0);
                quant::matmul(quantized, w, y).map_err(kernel_error)?;
            }
            Operand::Dense(w) => {
                if w.len() % input != 0 {
                    return Err(disagree);
                }
                let out = w.len() / input;
                y.resize(rows * out, 0.0);
                blas::sgemm(
                    true,
                    (rows, out, input),
                    1.0,
                    (x, input),
                    (w, input),
                    0.0,
                    (y, out),
                )?;
            }
        }
    }
    Ok(())
}

/// `out = norm(x)` row by row (`out` sized to `x`).
fn normed(norm: &RmsNorm, x: &[f32], out: &mut Vec<f32>) -> Result<(), ModelError> {
    out.resize(x.len(), 0.0);
    kernels::rms_norm(x, norm_weight(norm)?, norm.eps(), out);
    Ok(())
}

/// Adds a block's output (`s.residual`) to the stream `x`, through the block's post-norm where
/// the architecture has one (Gemma's sandwich norms); `mismatch` names the block when the
/// output's size is not the stream's.
fn add_block_output(
    x: &mut [f32],
    s: &mut Scratch,
    post_norm: Option<&RmsNorm>,
    mismatch: &'static str,
) -> Result<(), ModelError> {
    if let Some(norm) = post_norm {
        normed(norm, &s.residual, &mut s.normed)?;
        std::mem::swap(&mut s.residual, &mut s.normed);
    }
    if s.residual.len() != x.len() {
        return Err(ModelError::Shape(mismatch));
    }
    kernels::add(x, &s.residual);
    Ok(())
}

/// An MLX array made contiguous float32 where it is not (a chunk computed by the MLX path holds
/// transposed views); the same handle where it is.
fn contiguous(a: &Array) -> Result<Array, ModelError> {
    if a.try_as_slice::<f32>().is_ok() {
        return Ok(a.clone());
    }
    let made = a.as_dtype(mlx_rs::Dtype::Float32)?.contiguous()?;
    made.eval()?;
    Ok(made)
}

/// A cached chunk's keys or values (made contiguous by [`contiguous`]).
fn kv_values(a: &Array) -> Result<&[f32], ModelError> {
    a.try_as_slice::<f32>()
        .map_err(|_| ModelError::Shape("cached K/V are not float32"))
}

/// The buffers of one chunk, reused by every layer.
#[derive(Default)]
struct Scratch {
    normed: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    q_heads: Vec<f32>,
    k_heads: Vec<f32>,
    v_heads: Vec<f32>,
    attended: Vec<f32>,
    residual: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    attention: AttentionScratch,
    /// A projection's input quantised for the integer products.
    quantized: QuantizedRows,
}

/// The chunk `tokens` after the chunks `past` (in order, from position 0): every layer's K/V
/// of the chunk and its last position's hidden state after the final norm (`[hidden]`), as
/// `CausalLm::forward_chunk` returns them.
pub fn forward_chunk(
    model: &Weights<'_>,
    packed: &Packed,
    tokens: &[u32],
    past: &[PastChunk<'_>],
) -> Result<(Vec<LayerKv>, Array), ModelError> {
    let config = model.config;
    if tokens.is_empty() {
        return Err(ModelError::EmptyPrompt);
    }
    let hidden = config.hidden_size as usize;
    let len = tokens.len();
    let past_lens: Vec<i32> = past.iter().map(|c| c.len as i32).collect();
    let start: usize = past.iter().map(|c| c.len).sum();
    let window = if config.sliding_layers.iter().any(|&s| s) {
        config.sliding_window
    } else {
        i32::MAX
    };
    let (sliding_first, _) = sliding_span(&past_lens, window);

    let mut x = embed(model, tokens)?;

    // One table per distinct rotary embedding (Gemma 3's local and global layers differ).
    let mut tables: Vec<RopeTable> = Vec::new();
    let mut scratch = Scratch::default();
    let mut kv = Vec::with_capacity(model.layers.len());
    for (index, layer) in model.layers.iter().enumerate() {
        let attention = &layer.attention;
        let first = if attention.window.is_some() {
            sliding_first
        } else {
            0
        };
        let used = past.get(first..).unwrap_or_default();
        let key_start = start - used.iter().map(|c| c.len).sum::<usize>();
        // The earlier chunks' K/V of this layer as contiguous arrays, then their values.
        let arrays = used
            .iter()
            .map(|c| {
                let layer_kv =
                    c.kv.get(index)
                        .ok_or(ModelError::Shape("a cached chunk has fewer layers"))?;
                Ok((
                    contiguous(&layer_kv.keys)?,
                    contiguous(&layer_kv.values)?,
                    c.len,
                ))
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let past_kv = arrays
            .iter()
            .map(|(k, v, n)| {
                Ok(PastKv {
                    keys: kv_values(k)?,
                    values: kv_values(v)?,
                    len: *n,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let rope = match tables.iter().position(|t| t.rotates_like(&attention.rope)) {
            Some(found) => found,
            None => {
                tables.push(RopeTable::new(&attention.rope, start, len)?);
                tables.len() - 1
            }
        };
        let layer_kv = layer_forward(
            (layer, index, packed),
            (&mut x, hidden),
            &past_kv,
            (start, key_start),
            &tables[rope],
            &mut scratch,
        )?;
        kv.push(layer_kv);
    }

    // The last position's hidden state after the final norm.
    let last = &x[(len - 1) * hidden..];
    let mut out = vec![0.0f32; hidden];
    kernels::rms_norm(last, norm_weight(model.norm)?, model.norm.eps(), &mut out);
    Ok((kv, Array::from_slice(&out, &[config.hidden_size])))
}

/// One decoder layer over the chunk's residual stream `x` (`[len, hidden]`, updated in place);
/// returns the chunk's K/V of this layer.
fn layer_forward(
    (layer, index, packed): (&DecoderLayer, usize, &Packed),
    (x, hidden): (&mut [f32], usize),
    past: &[PastKv<'_>],
    (start, key_start): (usize, usize),
    rope: &RopeTable,
    s: &mut Scratch,
) -> Result<LayerKv, ModelError> {
    let a = &layer.attention;
    let (heads, kv_heads, d) = (
        a.num_heads as usize,
        a.num_kv_heads as usize,
        a.head_dim as usize,
    );
    let len = x.len() / hidden.max(1);
    let weight = |which| packed.operand(index, layer, which);

    normed(&layer.input_norm, x, &mut s.normed)?;
    project(
        &s.normed,
        len,
        &mut [
            (weight(Projection::Q)?, &mut s.q),
            (weight(Projection::K)?, &mut s.k),
            (weight(Projection::V)?, &mut s.v),
        ],
        &mut s.quantized,
    )?;
    if s.q.len() != len * heads * d || s.k.len() != len * kv_heads * d || s.v.len() != s.k.len() {
        return Err(ModelError::Shape("q/k/v projections and heads disagree"));
    }
    if let Some(norm) = &a.q_norm {
        let w = norm_weight(norm)?.ok_or(ModelError::Shape("a q norm without weight"))?;
        kernels::rms_norm_in_place(&mut s.q, w, norm.eps());
    }
    if let Some(norm) = &a.k_norm {
        let w = norm_weight(norm)?.ok_or(ModelError::Shape("a k norm without weight"))?;
        kernels::rms_norm_in_place(&mut s.k, w, norm.eps());
    }
    s.q_heads.resize(s.q.len(), 0.0);
    s.k_heads.resize(s.k.len(), 0.0);
    s.v_heads.resize(s.v.len(), 0.0);
    rope.apply(&s.q, heads, &mut s.q_heads)?;
    rope.apply(&s.k, kv_heads, &mut s.k_heads)?;
    heads_first(&s.v, kv_heads, d, &mut s.v_heads);

    s.attended.resize(len * heads * d, 0.0);
    let shape = Heads {
        heads,
        kv_heads,
        head_dim: d,
        scale: a.scale,
        window: a.window.map(|w| w.max(1) as usize),
    };
    attend(
        &shape,
        &s.q_heads,
        (&s.k_heads, &s.v_heads),
        past,
        start,
        key_start,
        &mut s.attention,
        &mut s.attended,
    )?;
    project(
        &s.attended,
        len,
        &mut [(weight(Projection::O)?, &mut s.residual)],
        &mut s.quantized,
    )?;
    add_block_output(
        x,
        s,
        layer.post_attention_norm.as_ref(),
        "the output projection and hidden size disagree",
    )?;

    normed(&layer.pre_mlp_norm, x, &mut s.normed)?;
    project(
        &s.normed,
        len,
        &mut [
            (weight(Projection::Gate)?, &mut s.gate),
            (weight(Projection::Up)?, &mut s.up),
        ],
        &mut s.quantized,
    )?;
    if s.gate.len() != s.up.len() {
        return Err(ModelError::Shape("gate and up projections disagree"));
    }
    match layer.mlp.activation {
        Activation::Silu => kernels::silu_mul(&mut s.gate, &s.up),
        Activation::GeluTanh => kernels::gelu_tanh_mul(&mut s.gate, &s.up),
    }
    project(
        &s.gate,
        len,
        &mut [(weight(Projection::Down)?, &mut s.residual)],
        &mut s.quantized,
    )?;
    add_block_output(
        x,
        s,
        layer.post_mlp_norm.as_ref(),
        "the down projection and hidden size disagree",
    )?;

    let shape = [1, kv_heads as i32, len as i32, d as i32];
    Ok(LayerKv {
        keys: Array::from_slice(&s.k_heads, &shape),
        values: Array::from_slice(&s.v_heads, &shape),
    })
}

/// The chunk's embedding rows (`[len, hidden]`): copied from a dense float32 table, or
/// dequantised or widened by MLX from a quantised or narrow one; Gemma's scale applied.
fn embed(model: &Weights<'_>, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
    let config = model.config;
    let hidden = config.hidden_size as usize;
    if let Some(&token) = tokens.iter().find(|&&t| t as i32 >= config.vocab_size) {
        return Err(ModelError::TokenOutOfRange {
            token,
            vocab: config.vocab_size,
        });
    }
    let mut x = match dense(model.embedding) {
        Ok(table) => {
            let mut x = vec![0.0f32; tokens.len() * hidden];
            for (row, &token) in x.chunks_exact_mut(hidden).zip(tokens) {
                let at = token as usize * hidden;
                let source = table
                    .get(at..at + hidden)
                    .ok_or(ModelError::TokenOutOfRange {
                        token,
                        vocab: config.vocab_size,
                    })?;
                row.copy_from_slice(source);
            }
            x
        }
        // Quantised or narrow: MLX dequantises or widens the chunk's rows.
        Err(_) => {
            let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
            let rows = model
                .embedding
                .rows(&Array::from_slice(&ids, &[ids.len() as i32]))?
                .as_dtype(mlx_rs::Dtype::Float32)?;
            rows.eval()?;
            rows.try_as_slice::<f32>()
                .map_err(|_| ModelError::Shape("embedding rows are not contiguous float32"))?
                .to_vec()
        }
    };
    if x.len() != tokens.len() * hidden {
        return Err(ModelError::Shape("embedding rows and hidden size disagree"));
    }
    if let Some(scale) = config.embedding_scale() {
        kernels::scale(&mut x, &[scale]);
    }
    Ok(x)
}
