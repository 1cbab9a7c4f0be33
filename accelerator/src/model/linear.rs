//! A bias-free linear layer whose weight is dense, affine-quantised (MLX arrays), or already
//! packed for the native integer products (a GGUF's blocks decoded straight into the packing).
//!
//! Loaders of every checkpoint layout build these through the public constructors; the math
//! only calls [`Linear::forward`] (and, for the tied embedding, [`Linear::rows`] and
//! [`Linear::forward_transposed`]).

use std::sync::Arc;

use hunch_kernels::quant::{self, PackedWeight, Precision, QuantizedRows};
use mlx_rs::{ops, Array, Dtype};

use super::{widened, ModelError};

/// Weight of a linear map `y = x · Wᵀ`, `W` of logical shape `[out, in]`.
#[derive(Clone, Debug)]
pub enum Linear {
    /// Plain weight `[out, in]` in the activation dtype.
    Dense {
        /// `[out, in]`.
        weight: Array,
    },
    /// MLX affine quantisation of `[out, in]`.
    Affine(Affine),
    /// A weight `[out, in]` packed for the native integer products at load (GGUF's block
    /// types: docs/checkpoint-layouts.md, "GGUF blocks on the native path"). Its values are
    /// the packing's own (`PackedWeight::row`), the very float32 values ggml dequantises:
    /// the native path multiplies it as it is, the embedding's and head's rows are read from
    /// it, and an MLX product (only where a model loaded for the native path is switched back
    /// to MLX) widens it for the call.
    Packed(Arc<PackedWeight>),
    /// A weight `[out, in]` whose rows stay where the loader found them (a GGUF's mapped blocks)
    /// and are dequantised as they are gathered: the embedding and the head, whose reads take
    /// a chunk's rows and a few label rows, so only the pages of the rows read are ever
    /// resident. A whole product widens it for the call.
    Rows(Arc<dyn RowSource>),
}

/// Rows of a weight kept by its loader, each as float32 values.
pub trait RowSource: Send + Sync + std::fmt::Debug {
    /// `(out, in)`.
    fn shape(&self) -> (usize, usize);
    /// Row `n`'s values into `values` (`in` of them).
    fn row(&self, n: usize, values: &mut [f32]) -> Result<(), ModelError>;
}

impl RowSource for PackedWeight {
    fn shape(&self) -> (usize, usize) {
        (self.out(), self.input())
    }

    fn row(&self, n: usize, values: &mut [f32]) -> Result<(), ModelError> {
        PackedWeight::row(self, n, values)
            .map_err(|_| ModelError::Shape("a row id outside a packed weight"))
    }
}

/// MLX affine quantisation (mlx-community layout) of a weight `[..., out, in]` (one matrix, or
/// a stack of experts): `weight` uint32 `[..., out, in·bits/32]`, `scales` and `biases`
/// `[..., out, in/group_size]`, as `mlx.core.quantize` produces them.
#[derive(Clone, Debug)]
pub struct Affine {
    /// Packed codes.
    pub weight: Array,
    /// One scale per group.
    pub scales: Array,
    /// One bias per group.
    pub biases: Array,
    /// Inputs per quantisation group (64 in mlx-community checkpoints).
    pub group_size: i32,
    /// Bits per code (4 or 8).
    pub bits: i32,
}

impl Affine {
    /// The parts `mlx.core.quantize` returns, and the group size and bits it was given.
    pub fn new(weight: Array, scales: Array, biases: Array, group_size: i32, bits: i32) -> Self {
        Affine {
            weight,
            scales,
            biases,
            group_size,
            bits,
        }
    }

    /// Runs one of MLX's quantized kernels (`quantized_matmul`, `gather_qmm`), given as
    /// `kernel(x, scales, biases)`, on `x` with this module's scales and biases.
    ///
    /// MLX's CPU backend (the prebuilt Linux wheels) runs these kernels one scalar at a time,
    /// and in bfloat16 or float16 every multiply and add converts to float32 and rounds back,
    /// the running sum included: at DiffusionGemma's shapes a bfloat16 product took 7–10x as
    /// long as the float32 one and was off by up to 12% of its range
    /// (docs/checkpoint-layouts.md, "Affine products on the CPU"). So on the CPU, inputs
    /// narrower than float32 are widened for the call: the activations, and the scales and
    /// biases (exactly; the widened copies are transient, one module's at a time, never kept,
    /// so resident memory stays what the checkpoint stores). The result is cast back to what
    /// MLX would have returned. Other backends get everything as stored.
    pub(crate) fn run_kernel(
        &self,
        x: &Array,
        kernel: impl FnOnce(&Array, &Array, &Array) -> Result<Array, mlx_rs::error::Exception>,
    ) -> Result<Array, ModelError> {
        let narrow = x.dtype() != Dtype::Float32 || self.scales.dtype() != Dtype::Float32;
        if !narrow || !widened::cpu_backend()? {
            widened::note_native(&[x, &self.scales]);
            return Ok(kernel(x, &self.scales, &self.biases)?);
        }
        widened::note(widened::Path::Widened);
        let natural = result_dtype(x.dtype(), self.scales.dtype());
        let y = kernel(
            &x.as_dtype(Dtype::Float32)?,
            &self.scales.as_dtype(Dtype::Float32)?,
            &self.biases.as_dtype(Dtype::Float32)?,
        )?;
        Ok(if natural == Dtype::Float32 {
            y
        } else {
            y.as_dtype(natural)?
        })
    }
}

/// The dtype MLX gives a quantized product of activations `x` with scales `s` (the wider of
/// the two floating types; float32 where they are bfloat16 and float16).
fn result_dtype(x: Dtype, s: Dtype) -> Dtype {
    match (x, s) {
        (a, b) if a == b => a,
        (Dtype::Bfloat16, Dtype::Float16) | (Dtype::Float16, Dtype::Bfloat16) => Dtype::Float32,
        (Dtype::Float32, _) | (_, Dtype::Float32) => Dtype::Float32,
        (Dtype::Float64, _) | (_, Dtype::Float64) => Dtype::Float64,
        (a, _) => a,
    }
}

impl Linear {
    /// A dense weight of shape `[out, in]`.
    pub fn dense(weight: Array) -> Self {
        Linear::Dense { weight }
    }

    /// An affine-quantised weight as `mlx.core.quantize` produces it.
    pub fn affine(weight: Array, scales: Array, biases: Array, group_size: i32, bits: i32) -> Self {
        Linear::Affine(Affine::new(weight, scales, biases, group_size, bits))
    }

    /// A weight packed for the native integer products.
    pub fn packed(weight: PackedWeight) -> Self {
        Linear::Packed(Arc::new(weight))
    }

    /// A weight whose rows its loader keeps, dequantised as gathered.
    pub fn rows_from(source: Arc<dyn RowSource>) -> Self {
        Linear::Rows(source)
    }

    /// `x · Wᵀ` over the last axis of `x`.
    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        self.product(x, true)
    }

    /// `x · Wᵀ` with a packed weight multiplied by the native integer products (each row of `x`
    /// rounded to `precision` first, as the causal native path rounds it), any other weight as
    /// [`Linear::forward`] multiplies it: for a model whose every product is computed so (the
    /// encoder, `model::encoder`). The result is float32 `[..., out]`.
    pub fn forward_native(&self, x: &Array, precision: Precision) -> Result<Array, ModelError> {
        let Linear::Packed(w) = self else {
            return self.forward(x);
        };
        let mut shape = x.shape().to_vec();
        let input = shape.last().copied().unwrap_or(0) as usize;
        if input != w.input() {
            return Err(ModelError::Shape("a product's input and weight disagree"));
        }
        let rows = x.size() / input.max(1);
        let x = x.as_dtype(Dtype::Float32)?;
        x.eval()?;
        let values = x
            .try_as_slice::<f32>()
            .map_err(|_| ModelError::Shape("a product's input is not contiguous float32"))?;
        let failed = |e: quant::QuantError| ModelError::NativeKernels(e.to_string());
        let mut quantized = QuantizedRows::default();
        quantized
            .quantize(values, rows, precision)
            .map_err(failed)?;
        let mut y = vec![0.0f32; rows * w.out()];
        quant::matmul(&quantized, w, &mut y).map_err(failed)?;
        if let Some(last) = shape.last_mut() {
            *last = w.out() as i32;
        }
        Ok(Array::from_slice(&y, &shape))
    }

    /// `x · W` (x's last axis has `out` entries): the soft embedding `p · E` of self-conditioning.
    pub fn forward_transposed(&self, x: &Array) -> Result<Array, ModelError> {
        self.product(x, false)
    }

    /// `x · Wᵀ` when `transpose`, else `x · W`.
    fn product(&self, x: &Array, transpose: bool) -> Result<Array, ModelError> {
        match self {
            // bf16 weights in float32 on the CPU, a slice at a time (`widened`).
            Linear::Dense { weight } => widened::dense_matmul(x, weight, transpose),
            Linear::Affine(q) => q.run_kernel(x, |x, scales, biases| {
                ops::quantized_matmul(
                    x,
                    &q.weight,
                    scales,
                    biases,
                    transpose,
                    q.group_size,
                    q.bits,
                )
            }),
            Linear::Packed(p) => whole(p.as_ref(), x, transpose),
            Linear::Rows(r) => whole(r.as_ref(), x, transpose),
        }
    }

    /// Rows `W[ids]` (embedding lookup), dequantised; `ids` of any shape, result `[..., in]`.
    pub fn rows(&self, ids: &Array) -> Result<Array, ModelError> {
        match self {
            Linear::Dense { weight } => Ok(weight.take_axis(ids, 0)?),
            Linear::Affine(q) => {
                let w = q.weight.take_axis(ids, 0)?;
                let s = q.scales.take_axis(ids, 0)?;
                let b = q.biases.take_axis(ids, 0)?;
                Ok(ops::dequantize(&w, &s, &b, q.group_size, q.bits)?)
            }
            Linear::Packed(p) => gathered(p.as_ref(), ids),
            Linear::Rows(r) => gathered(r.as_ref(), ids),
        }
    }

    /// The dtype results come out in (the dense weight's or the scales').
    pub fn dtype(&self) -> Dtype {
        match self {
            Linear::Dense { weight } => weight.dtype(),
            Linear::Affine(q) => q.scales.dtype(),
            Linear::Packed(_) | Linear::Rows(_) => Dtype::Float32,
        }
    }
}

/// Rows `ids` (any shape) of a weight kept as rows, `[..., in]` float32.
fn gathered(source: &dyn RowSource, ids: &Array) -> Result<Array, ModelError> {
    let shape = ids.shape().to_vec();
    let ids = ids.as_dtype(Dtype::Int32)?;
    ids.eval()?;
    let wanted: Vec<u32> = ids
        .try_as_slice::<i32>()
        .map_err(|_| ModelError::Shape("row ids are not contiguous"))?
        .iter()
        .map(|&i| u32::try_from(i).unwrap_or(u32::MAX))
        .collect();
    let rows = rows_of(source, &wanted)?;
    let mut out_shape = shape;
    out_shape.push(source.shape().1 as i32);
    Ok(rows.reshape(&out_shape)?)
}

/// `x · Wᵀ` (or `x · W`) with every row of `source` widened for the call.
fn whole(source: &dyn RowSource, x: &Array, transpose: bool) -> Result<Array, ModelError> {
    let all: Vec<u32> = (0..source.shape().0 as u32).collect();
    widened::dense_matmul(x, &rows_of(source, &all)?, transpose)
}

/// Rows `ids` of `source` as a float32 `[ids.len(), in]` array.
fn rows_of(source: &dyn RowSource, ids: &[u32]) -> Result<Array, ModelError> {
    let input = source.shape().1;
    let mut values = vec![0.0f32; ids.len() * input];
    for (row, &id) in values.chunks_exact_mut(input).zip(ids) {
        source.row(id as usize, row)?;
    }
    Ok(Array::from_slice(
        &values,
        &[ids.len() as i32, input as i32],
    ))
}
