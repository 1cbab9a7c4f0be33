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

/// Adds a projection's bias (float32 `[out]`) to each row of `y` (`[rows, out]`), where it has
/// one: after the product, as the MLX path adds it.
fn add_bias(y: &mut [f32], bias: Option<&Array>) -> Result<(), ModelError> {
    let Some(bias) = bias else {
        return Ok(());
    };
    let bias = bias
        .try_as_slice::<f32>()
        .map_err(|_| ModelError::Shape("a projection bias is not contiguous float32"))?;
    if bias.is_empty() || y.len() % bias.len() != 0 {
        return Err(ModelError::Shape(
            "a projection bias and its output disagree",
        ));
    }
    for row in y.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
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
    let mut done = forward_batch(model, packed, &[(tokens, past)])?;
    done.pop().ok_or(ModelError::EmptyPrompt)
}

/// Several chunks, each after its own earlier chunks, through every layer together: their rows
/// share each projection (one quantisation, one pass over the weights), each attends to its own
/// keys. Each chunk's results are what [`forward_chunk`] gives it alone wherever an output row
/// of a product depends only on its input row (the integer products: `Packed::all`); elsewhere
/// the stacked products may differ from it in the last bits, so the engine batches only there.
pub fn forward_batch(
    model: &Weights<'_>,
    packed: &Packed,
    chunks: &[(&[u32], &[PastChunk<'_>])],
) -> Result<Vec<(Vec<LayerKv>, Array)>, ModelError> {
    let last: Vec<Vec<usize>> = chunks
        .iter()
        .map(|(tokens, _)| vec![tokens.len().saturating_sub(1)])
        .collect();
    forward_batch_rows(model, packed, chunks, &last)?
        .into_iter()
        .map(|(kv, mut hidden)| Ok((kv, hidden.pop().ok_or(ModelError::EmptyPrompt)?)))
        .collect()
}

/// A chunk's K/V in every layer and its hidden states at the positions asked.
pub type ChunkRows = (Vec<LayerKv>, Vec<Array>);

/// [`forward_batch`], each chunk giving its hidden states after the final norm (`[hidden]`
/// each) at its positions `rows[i]` (counted from the chunk's start) rather than at its last:
/// a pointer read takes several positions of a prompt (`read::decision`'s kev).
pub fn forward_batch_rows(
    model: &Weights<'_>,
    packed: &Packed,
    chunks: &[(&[u32], &[PastChunk<'_>])],
    rows: &[Vec<usize>],
) -> Result<Vec<ChunkRows>, ModelError> {
    let config = model.config;
    if chunks.is_empty() || chunks.iter().any(|(tokens, _)| tokens.is_empty()) {
        return Err(ModelError::EmptyPrompt);
    }
    if rows.len() != chunks.len()
        || chunks
            .iter()
            .zip(rows)
            .any(|((tokens, _), rows)| rows.iter().any(|&r| r >= tokens.len()))
    {
        return Err(ModelError::Shape("a hidden state asked outside its chunk"));
    }
    let hidden = config.hidden_size as usize;
    let window = if config.sliding_layers.iter().any(|&s| s) {
        config.sliding_window
    } else {
        i32::MAX
    };
    // Where each chunk's rows sit in the stacked stream, where it starts, and the first earlier
    // chunk its sliding layers use.
    let mut places = Vec::with_capacity(chunks.len());
    let mut x = Vec::new();
    for (tokens, past) in chunks {
        let past_lens: Vec<i32> = past.iter().map(|c| c.len as i32).collect();
        let first_row = x.len() / hidden.max(1);
        x.extend(embed(model, tokens)?);
        places.push(Place {
            rows: first_row..first_row + tokens.len(),
            start: past.iter().map(|c| c.len).sum(),
            sliding_first: sliding_span(&past_lens, window).0,
            tables: Vec::new(),
        });
    }

    let mut scratch = Scratch::default();
    let mut kv: Vec<Vec<LayerKv>> = chunks
        .iter()
        .map(|_| Vec::with_capacity(model.layers.len()))
        .collect();
    for (index, layer) in model.layers.iter().enumerate() {
        let attention = &layer.attention;
        let mut contexts = Vec::with_capacity(chunks.len());
        for ((_, past), place) in chunks.iter().zip(&mut places) {
            let first = if attention.window.is_some() {
                place.sliding_first
            } else {
                0
            };
            let used = past.get(first..).unwrap_or_default();
            // The earlier chunks' K/V of this layer as contiguous arrays.
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
            // One table per distinct rotary embedding (Gemma 3's local and global layers
            // differ), per chunk (its positions).
            let rope = match place
                .tables
                .iter()
                .position(|t| t.rotates_like(&attention.rope))
            {
                Some(found) => found,
                None => {
                    let table = RopeTable::new(&attention.rope, place.start, place.rows.len())?;
                    place.tables.push(table);
                    place.tables.len() - 1
                }
            };
            contexts.push((arrays, used.iter().map(|c| c.len).sum::<usize>(), rope));
        }
        let contexts = contexts
            .iter()
            .zip(&places)
            .map(|((arrays, used_len, rope), place)| {
                let past = arrays
                    .iter()
                    .map(|(k, v, n)| {
                        Ok(PastKv {
                            keys: kv_values(k)?,
                            values: kv_values(v)?,
                            len: *n,
                        })
                    })
                    .collect::<Result<Vec<_>, ModelError>>()?;
                Ok(ChunkContext {
                    rows: place.rows.clone(),
                    past,
                    start: place.start,
                    key_start: place.start - used_len,
                    rope: &place.tables[*rope],
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let layer_kv = layer_forward(
            (layer, index, packed),
            (&mut x, hidden),
            &contexts,
            &mut scratch,
        )?;
        for (all, one) in kv.iter_mut().zip(layer_kv) {
            all.push(one);
        }
    }

    // Each chunk's asked positions' hidden states after the final norm, row by row.
    let norm = norm_weight(model.norm)?;
    kv.into_iter()
        .zip(&places)
        .zip(rows)
        .map(|((kv, place), rows)| {
            let states = rows
                .iter()
                .map(|&r| {
                    let at = place.rows.start + r;
                    let mut out = vec![0.0f32; hidden];
                    kernels::rms_norm(
                        &x[at * hidden..(at + 1) * hidden],
                        norm,
                        model.norm.eps(),
                        &mut out,
                    );
                    Array::from_slice(&out, &[config.hidden_size])
                })
                .collect();
            Ok((kv, states))
        })
        .collect()
}

/// One chunk of a batch: its rows in the stacked stream, first position, the first earlier
/// chunk its sliding layers use, and its rotary tables.
struct Place {
    rows: std::ops::Range<usize>,
    start: usize,
    sliding_first: usize,
    tables: Vec<RopeTable>,
}

/// What one chunk of a batch attends with in one layer.
struct ChunkContext<'a> {
    rows: std::ops::Range<usize>,
    /// The earlier chunks' K/V of this layer.
    past: Vec<PastKv<'a>>,
    start: usize,
    /// The position of the first key in `past`.
    key_start: usize,
    rope: &'a RopeTable,
}

/// One decoder layer over the stacked residual stream `x` (`[rows, hidden]`, updated in place)
/// of the chunks `contexts`; returns each chunk's K/V of this layer.
fn layer_forward(
    (layer, index, packed): (&DecoderLayer, usize, &Packed),
    (x, hidden): (&mut [f32], usize),
    contexts: &[ChunkContext<'_>],
    s: &mut Scratch,
) -> Result<Vec<LayerKv>, ModelError> {
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
    add_bias(&mut s.q, a.biases.q.as_ref())?;
    add_bias(&mut s.k, a.biases.k.as_ref())?;
    add_bias(&mut s.v, a.biases.v.as_ref())?;
    if let Some(norm) = &a.q_norm {
        let w = norm_weight(norm)?.ok_or(ModelError::Shape("a q norm without weight"))?;
        kernels::rms_norm_in_place(&mut s.q, w, norm.eps());
    }
    if let Some(norm) = &a.k_norm {
        let w = norm_weight(norm)?.ok_or(ModelError::Shape("a k norm without weight"))?;
        kernels::rms_norm_in_place(&mut s.k, w, norm.eps());
    }
    s.attended.resize(len * heads * d, 0.0);
    let shape = Heads {
        heads,
        kv_heads,
        head_dim: d,
        scale: a.scale,
        window: a.window.map(|w| w.max(1) as usize),
    };
    let mut kv = Vec::with_capacity(contexts.len());
    for c in contexts {
        // This chunk's rows, rotated and heads first (`[heads, rows, d]`), attending to its own
        // keys only.
        let (q, k, v) = (
            &s.q[c.rows.start * heads * d..c.rows.end * heads * d],
            &s.k[c.rows.start * kv_heads * d..c.rows.end * kv_heads * d],
            &s.v[c.rows.start * kv_heads * d..c.rows.end * kv_heads * d],
        );
        s.q_heads.resize(q.len(), 0.0);
        s.k_heads.resize(k.len(), 0.0);
        s.v_heads.resize(v.len(), 0.0);
        c.rope.apply(q, heads, &mut s.q_heads)?;
        c.rope.apply(k, kv_heads, &mut s.k_heads)?;
        heads_first(v, kv_heads, d, &mut s.v_heads);
        attend(
            &shape,
            &s.q_heads,
            (&s.k_heads, &s.v_heads),
            &c.past,
            c.start,
            c.key_start,
            &mut s.attention,
            &mut s.attended[c.rows.start * heads * d..c.rows.end * heads * d],
        )?;
        let shape = [1, kv_heads as i32, c.rows.len() as i32, d as i32];
        kv.push(LayerKv {
            keys: Array::from_slice(&s.k_heads, &shape),
            values: Array::from_slice(&s.v_heads, &shape),
        });
    }
    project(
        &s.attended,
        len,
        &mut [(weight(Projection::O)?, &mut s.residual)],
        &mut s.quantized,
    )?;
    add_bias(&mut s.residual, a.biases.o.as_ref())?;
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
    Ok(kv)
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
