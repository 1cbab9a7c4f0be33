//! What the native path multiplies with: each projection's weight as the chunk reads it: the
//! dense float32 values borrowed from the loaded array (products in the BLAS's `sgemm`), a
//! bf16/f16 weight widened once to float32, or an affine-quantised weight repacked once for the
//! integer products of [`kernels::quant`](super::kernels::quant) (docs/logit-read.md,
//! "Kernels").
//!
//! The repacking is what the native path adds to a quantised model's memory: half a byte per
//! weight for 4-bit codes (nibbles), one for 8-bit, and eight per row and block of 32 inputs
//! (0.75 bytes a weight at 4 bits, 1.25 at 8, against 4 for float32 widened at load; four per
//! block where every bias is a multiple of its scale); the checkpoint's own packed arrays stay
//! loaded for the MLX path and the embedding rows. A GGUF loaded for the native path comes
//! packed already ([`Linear::Packed`]): the model holds that one copy, shared here, and nothing
//! else.

use std::sync::Arc;

use mlx_rs::Dtype;

use crate::model::causal::blocks::DecoderLayer;
use crate::model::linear::{Affine, Linear};
use crate::model::ModelError;

use super::kernels::quant::{self, PackedWeight, Precision};

/// A layer's seven projections, in the order the forward reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Projection {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Projection {
    pub(super) const ALL: [Projection; 7] = [
        Projection::Q,
        Projection::K,
        Projection::V,
        Projection::O,
        Projection::Gate,
        Projection::Up,
        Projection::Down,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            Projection::Q => "q_proj",
            Projection::K => "k_proj",
            Projection::V => "v_proj",
            Projection::O => "o_proj",
            Projection::Gate => "gate_proj",
            Projection::Up => "up_proj",
            Projection::Down => "down_proj",
        }
    }

    pub(super) fn of(self, layer: &DecoderLayer) -> &Linear {
        let a = &layer.attention;
        match self {
            Projection::Q => &a.q_proj,
            Projection::K => &a.k_proj,
            Projection::V => &a.v_proj,
            Projection::O => &a.o_proj,
            Projection::Gate => &layer.mlp.gate,
            Projection::Up => &layer.mlp.up,
            Projection::Down => &layer.mlp.down,
        }
    }
}

/// A projection prepared for the native path where the loaded weight is not float32.
enum Prepared {
    /// An affine weight repacked for the integer products (the native path's own copy), or
    /// the loader's packing shared (`own` false: the checkpoint's bytes count it already).
    Int8 {
        weight: Arc<PackedWeight>,
        own: bool,
    },
    /// A bfloat16 or float16 weight widened to float32 once (4 bytes a weight beside the 2 the
    /// checkpoint keeps), for the BLAS's `sgemm`.
    Widened(Vec<f32>),
}

/// Largest total the widened bf16/f16 projections may take (float32 bytes): past it the model
/// keeps the MLX path, as `--affine-weights auto` keeps large models quantised.
pub const WIDEN_LIMIT: usize = 6 << 30;

/// The projections of a model prepared for the native path (empty when every weight is dense
/// float32).
#[derive(Default)]
pub struct Packed {
    /// Per layer, per [`Projection`]: the prepared weight where the loaded one is not float32.
    layers: Vec<[Option<Prepared>; 7]>,
    /// How finely the products' inputs are rounded.
    precision: Precision,
}

/// A projection's weight as the native path multiplies it.
pub(super) enum Operand<'a> {
    Dense(&'a [f32]),
    /// The weight, and how finely its inputs are rounded.
    Int8(&'a PackedWeight, Precision),
}

impl Packed {
    /// Prepares every projection of `layers` that is not dense float32: affine ones repacked
    /// (when `int8`), bf16/f16 ones widened (up to [`WIDEN_LIMIT`] in all); `Err` names the
    /// first one that cannot be.
    pub(super) fn new(layers: &[DecoderLayer], int8: bool) -> Result<Self, String> {
        let mut packed = Vec::with_capacity(layers.len());
        let mut widened_bytes = 0usize;
        for (i, layer) in layers.iter().enumerate() {
            let mut these: [Option<Prepared>; 7] = Default::default();
            for (slot, which) in these.iter_mut().zip(Projection::ALL) {
                let name = || format!("layer {i} {}", which.name());
                let linear = which.of(layer);
                *slot = match linear {
                    Linear::Affine(q) if int8 => Some(Prepared::Int8 {
                        weight: Arc::new(repack(q).map_err(|e| format!("{}: {e}", name()))?),
                        own: true,
                    }),
                    Linear::Packed(p) if int8 => Some(Prepared::Int8 {
                        weight: Arc::clone(p),
                        own: false,
                    }),
                    Linear::Rows(_) => {
                        return Err(format!(
                            "{} is kept as rows to gather, not packed for products",
                            name()
                        ))
                    }
                    Linear::Affine(_) | Linear::Packed(_) => {
                        return Err(format!(
                            "{} is quantised and the integer products have no SIMD copy for \
                             this CPU (AVX2 or NEON at least; `native` runs the portable one)",
                            name()
                        ))
                    }
                    Linear::Dense { .. } if dense(linear).is_ok() => None,
                    Linear::Dense { weight } => {
                        let values = widen(weight).map_err(|e| format!("{}: {e}", name()))?;
                        widened_bytes += 4 * values.len();
                        if widened_bytes > WIDEN_LIMIT {
                            return Err(format!(
                                "its {:?} weights take more than {} GiB widened to float32",
                                linear.dtype(),
                                WIDEN_LIMIT >> 30
                            ));
                        }
                        Some(Prepared::Widened(values))
                    }
                };
            }
            packed.push(these);
        }
        Ok(Packed {
            layers: packed,
            precision: Precision::default(),
        })
    }

    /// Rounds the products' inputs at `precision` from now on.
    pub fn set_precision(&mut self, precision: Precision) {
        self.precision = precision;
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Whether any projection runs on the integer products.
    pub fn any(&self) -> bool {
        self.prepared().any(|p| matches!(p, Prepared::Int8 { .. }))
    }

    /// Whether every projection runs on the integer products (each output row's bits then
    /// depend only on its input row: with the native attention, a prompt can be split anywhere).
    pub fn all(&self) -> bool {
        !self.layers.is_empty()
            && self
                .layers
                .iter()
                .flatten()
                .all(|p| matches!(p, Some(Prepared::Int8 { .. })))
    }

    /// Whether any projection was widened from bf16/f16.
    pub fn any_widened(&self) -> bool {
        self.prepared().any(|p| matches!(p, Prepared::Widened(_)))
    }

    fn prepared(&self) -> impl Iterator<Item = &Prepared> {
        self.layers.iter().flatten().flatten()
    }

    /// Bytes the prepared weights hold beside the checkpoint's (a packing shared with the
    /// loader is the checkpoint's).
    pub fn bytes(&self) -> usize {
        self.prepared()
            .map(|p| match p {
                Prepared::Int8 { weight, own: true } => weight.bytes(),
                Prepared::Int8 { own: false, .. } => 0,
                Prepared::Widened(v) => 4 * v.len(),
            })
            .sum()
    }

    /// Layer `index`'s projection `which` (`layer` is that layer).
    pub(super) fn operand<'a>(
        &'a self,
        index: usize,
        layer: &'a DecoderLayer,
        which: Projection,
    ) -> Result<Operand<'a>, ModelError> {
        let packed = self
            .layers
            .get(index)
            .and_then(|l| l[which as usize].as_ref());
        match packed {
            Some(Prepared::Int8 { weight, .. }) => Ok(Operand::Int8(weight, self.precision)),
            Some(Prepared::Widened(v)) => Ok(Operand::Dense(v)),
            None => Ok(Operand::Dense(dense(which.of(layer))?)),
        }
    }
}

/// A dense float32 weight's values, borrowed from its (evaluated, row-contiguous) array.
pub(super) fn dense(linear: &Linear) -> Result<&[f32], ModelError> {
    match linear {
        Linear::Dense { weight } => weight
            .try_as_slice::<f32>()
            .map_err(|_| ModelError::Shape("a weight is not contiguous float32")),
        Linear::Affine(_) | Linear::Packed(_) | Linear::Rows(_) => {
            Err(ModelError::Shape("a quantised weight on the native path"))
        }
    }
}

/// An affine weight's codes, scales and biases (evaluated; scales and biases as float32) in
/// the integer products' layout.
fn repack(q: &Affine) -> Result<PackedWeight, String> {
    let shape = q.weight.shape();
    if shape.len() != 2 {
        return Err(format!("a {}-axis quantised weight", shape.len()));
    }
    let out = shape[0] as usize;
    let input = shape[1] as usize * 32 / q.bits.max(1) as usize;
    let words = q
        .weight
        .as_dtype(Dtype::Uint32)
        .and_then(|w| w.contiguous())
        .map_err(|e| e.to_string())?;
    let floats = |a: &mlx_rs::Array| {
        a.as_dtype(Dtype::Float32)
            .and_then(|a| a.contiguous())
            .map_err(|e| e.to_string())
    };
    let (scales, biases) = (floats(&q.scales)?, floats(&q.biases)?);
    mlx_rs::transforms::eval([&words, &scales, &biases]).map_err(|e| e.to_string())?;
    let slice_u32 = words
        .try_as_slice::<u32>()
        .map_err(|_| "its codes are not contiguous".to_owned())?;
    fn slice(a: &mlx_rs::Array) -> Result<&[f32], String> {
        a.try_as_slice::<f32>()
            .map_err(|_| "its scales or biases are not contiguous".to_owned())
    }
    PackedWeight::from_affine(
        slice_u32,
        slice(&scales)?,
        slice(&biases)?,
        (out, input),
        q.group_size.max(0) as usize,
        q.bits.max(0) as u32,
    )
    .map_err(|e| e.to_string())
}

/// Whether affine weights can run on the integer products in this process: fast here
/// ([`quant::fast`]), or asked for anyway (`native`, one scalar at a time).
pub(super) fn int8_allowed(forced: bool) -> bool {
    forced || quant::fast()
}

/// A narrow float weight's values in float32, converted here rather than by MLX (whose buffer
/// cache would keep each freed float32 copy: 4 bytes a weight more, for nothing).
fn widen(weight: &mlx_rs::Array) -> Result<Vec<f32>, String> {
    weight.eval().map_err(|e| e.to_string())?;
    fn widened<T: mlx_rs::ArrayElement + Copy + Into<f32>>(
        weight: &mlx_rs::Array,
    ) -> Result<Vec<f32>, String> {
        let values = weight
            .try_as_slice::<T>()
            .map_err(|_| "its values are not contiguous".to_owned())?;
        Ok(values.iter().map(|&v| v.into()).collect())
    }
    match weight.dtype() {
        Dtype::Bfloat16 => widened::<half::bf16>(weight),
        Dtype::Float16 => widened::<half::f16>(weight),
        other => Err(format!("{other:?} weights are not widened")),
    }
}
