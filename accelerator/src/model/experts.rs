//! The stacked expert weights of a MoE layer: dense, affine-quantised or NVFP4.
//!
//! All three compute, for tokens `x` `[N, 1, 1, in]` and expert ids `idx` `[N, k]`, the per-expert
//! products `x · W[idx]ᵀ` → `[N, k, 1, out]`.

use std::ffi::CString;

use mlx_rs::{ops, Array, Dtype};

use super::ModelError;

/// NVFP4's tensor-scale convention: MLX's `global_scale` is the abs-max form, so one unit of a
/// block scale is `global_scale / (448 · 6)` (diffusiongemma.md §2.1).
pub const NVFP4_GLOBAL_SCALE_DIVISOR: f32 = 2688.0;

/// Stacked expert matrices `[E, out, in]`.
#[derive(Clone, Debug)]
pub enum Experts {
    /// Dense float weights. MLX's CPU `gather_mm` only supports float32, so these are kept in
    /// float32 whatever the activation dtype is.
    Dense {
        /// `[E, out, in]`, float32.
        weight: Array,
    },
    /// Affine-quantised (mlx-community layout), through `gather_qmm` mode "affine".
    Affine {
        /// uint32 codes `[E, out, in·bits/32]`.
        weight: Array,
        /// `[E, out, in/group_size]`.
        scales: Array,
        /// `[E, out, in/group_size]`.
        biases: Array,
        /// Inputs per group.
        group_size: i32,
        /// Bits per code.
        bits: i32,
    },
    /// NVFP4: E2M1 codes (uint32 `[E, out, in/8]`), E4M3 block scales (uint8 `[E, out, in/16]`)
    /// and one float32 `global_scale` per expert (`[E]`, = 2688 · ModelOpt `weight_scale_2`).
    Nvfp4 {
        /// Packed E2M1 codes.
        weight: Array,
        /// E4M3 block scales, one per 16 inputs.
        scales: Array,
        /// Per-expert tensor scale (abs-max convention), float32 `[E]`.
        global_scale: Array,
    },
}

impl Experts {
    /// Dense experts from `[E, out, in]` (cast to float32 here; see [`Experts::Dense`]).
    pub fn dense(weight: Array) -> Result<Self, ModelError> {
        let weight = weight.as_dtype(Dtype::Float32)?;
        weight.eval()?;
        Ok(Experts::Dense { weight })
    }

    /// Affine-quantised experts as `mlx.core.quantize` produces them for a `[E, out, in]` stack.
    pub fn affine(weight: Array, scales: Array, biases: Array, group_size: i32, bits: i32) -> Self {
        Experts::Affine {
            weight,
            scales,
            biases,
            group_size,
            bits,
        }
    }

    /// NVFP4 experts. `global_scale` is MLX's abs-max convention (`2688 · weight_scale_2`).
    pub fn nvfp4(weight: Array, scales: Array, global_scale: Array) -> Result<Self, ModelError> {
        let global_scale = global_scale.as_dtype(Dtype::Float32)?;
        Ok(Experts::Nvfp4 {
            weight,
            scales,
            global_scale,
        })
    }

    /// `x` `[N, 1, 1, in]`, `idx` uint32 `[N, k]` → `[N, k, 1, out]` in `x`'s dtype.
    pub fn forward(&self, x: &Array, idx: &Array) -> Result<Array, ModelError> {
        let dtype = x.dtype();
        match self {
            Experts::Dense { weight } => {
                let x32 = x.as_dtype(Dtype::Float32)?;
                let wt = weight.swap_axes(-1, -2)?;
                let y = ops::gather_mm(&x32, &wt, None, idx, false)?;
                Ok(y.as_dtype(dtype)?)
            }
            Experts::Affine {
                weight,
                scales,
                biases,
                group_size,
                bits,
            } => Ok(ops::gather_qmm(
                x,
                weight,
                scales,
                biases,
                None,
                idx,
                true,
                *group_size,
                *bits,
                false,
            )?),
            Experts::Nvfp4 {
                weight,
                scales,
                global_scale,
            } => {
                // mlx-c 0.7.0's gather_qmm has no global_scale argument (and MLX's CPU backend
                // refuses one anyway), so: matmul with the block scales only, in float32, then
                // scale each expert's output rows by global_scale[expert] / 2688.
                let x32 = x.as_dtype(Dtype::Float32)?;
                let y = gather_qmm_nvfp4(&x32, weight, scales, idx)?;
                let gs = ops::divide(
                    global_scale.take_axis(idx, 0)?,
                    Array::from_f32(NVFP4_GLOBAL_SCALE_DIVISOR),
                )?;
                let gs = gs.reshape(&[idx.dim(0), idx.dim(1), 1, 1])?;
                Ok(ops::multiply(y, gs)?.as_dtype(dtype)?)
            }
        }
    }
}

/// `gather_qmm` in mode "nvfp4" (group 16, 4 bits, transposed weights), which mlx-rs's safe API
/// cannot express because it hard-codes mode "affine".
pub fn gather_qmm_nvfp4(
    x: &Array,
    w: &Array,
    scales: &Array,
    rhs_indices: &Array,
) -> Result<Array, ModelError> {
    // Routes any MLX error through mlx-rs's handler (installed on the first safe op) rather than
    // mlx-c's default, which aborts the process.
    let _ = Array::from_int(0).as_dtype(Dtype::Int32)?;
    let mode = CString::new("nvfp4").map_err(|_| ModelError::Nvfp4("mode string".into()))?;
    let stream = mlx_rs::Stream::thread_local_or_default();
    // SAFETY: every handle passed is a live mlx_array owned by the caller for the duration of the
    // call; the empty arrays stand for mlx-c's "null" optional inputs; `res` is a fresh handle
    // that we take ownership of below whether or not the call succeeded.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let none = mlx_sys::mlx_array_new();
        let status = mlx_sys::mlx_gather_qmm(
            &mut res,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            none,
            none,
            rhs_indices.as_ptr(),
            true,
            mlx_sys::mlx_optional_int {
                value: 16,
                has_value: true,
            },
            mlx_sys::mlx_optional_int {
                value: 4,
                has_value: true,
            },
            mode.as_ptr(),
            false,
            stream.as_ptr(),
        );
        mlx_sys::mlx_array_free(none);
        let out = Array::from_ptr(res);
        if status != 0 {
            return Err(ModelError::Nvfp4(format!(
                "mlx_gather_qmm(mode=nvfp4) failed for x {:?}, w {:?}, scales {:?}",
                x.shape(),
                w.shape(),
                scales.shape()
            )));
        }
        Ok(out)
    }
}
