//! The stacked expert weights of a MoE layer: dense, affine-quantised or NVFP4.
//!
//! All three compute, for tokens `x` `[N, 1, 1, in]` and expert ids `idx` `[N, k]`, the per-expert
//! products `x · W[idx]ᵀ` → `[N, k, 1, out]`.

use std::ffi::CString;

use mlx_rs::{ops, Array, Dtype};

use crate::model::linear::Affine;
use crate::model::widened;
use crate::model::ModelError;

/// NVFP4's tensor-scale convention: MLX's `global_scale` is the abs-max form, so one unit of a
/// block scale is `global_scale / (448 · 6)` (docs/model.md, "NVFP4 experts").
pub const NVFP4_GLOBAL_SCALE_DIVISOR: f32 = 2688.0;

/// Stacked expert matrices `[E, out, in]`.
#[derive(Clone, Debug)]
pub enum Experts {
    /// Dense float weights, held in the dtype the loader gives them (the activation dtype: a
    /// bf16 checkpoint stays bf16 with bf16 activations). MLX's CPU `gather_mm` only runs
    /// float32, so on the CPU narrower weights are widened per call instead of once at load:
    /// `Moe::forward` groups the pairs by expert and widens only the chosen experts
    /// ([`Experts::cpu_dense_matrices`]); [`Experts::forward`] widens the stack in bounded
    /// slices (`model::widened`).
    Dense {
        /// `[E, out, in]`.
        weight: Array,
    },
    /// Affine-quantised (mlx-community layout) `[E, out, in]`, through `gather_qmm` mode
    /// "affine".
    Affine(Affine),
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
    /// Dense experts from `[E, out, in]`, kept in their dtype (see [`Experts::Dense`]).
    pub fn dense(weight: Array) -> Result<Self, ModelError> {
        Ok(Experts::Dense { weight })
    }

    /// Affine-quantised experts as `mlx.core.quantize` produces them for a `[E, out, in]` stack.
    pub fn affine(weight: Array, scales: Array, biases: Array, group_size: i32, bits: i32) -> Self {
        Experts::Affine(Affine::new(weight, scales, biases, group_size, bits))
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
        self.gather(x, idx, false)
    }

    /// One row per (token, expert) pair, the pairs sorted by expert (as mlx-lm's SwitchGLU
    /// dispatches): `x` `[M, 1, in]`, `idx` uint32 `[M]` ascending → `[M, 1, out]`. Sorted
    /// indices let a GPU run one grouped GEMM per expert instead of a matrix-vector product
    /// per pair, each expert's weights read once.
    pub fn forward_sorted(&self, x: &Array, idx: &Array) -> Result<Array, ModelError> {
        self.gather(x, idx, true)
    }

    /// For a dense stack narrower than float32 on MLX's CPU backend, each expert's matrix
    /// `[out, in]` (views of the stack, nothing copied), for products grouped by expert on the
    /// host (`Moe::forward`); `None` for float32 and quantised stacks and on a GPU, whose
    /// grouped kernels take the stack as it is.
    ///
    /// Why: MLX's CPU `gather_mm` runs float32 only, one matrix-vector product per (token,
    /// expert) pair, so a bfloat16 stack must be widened whole (every expert, used or not) for
    /// it, at every pass; one product per used expert over all its tokens widens each used
    /// expert once, in cache-sized slices (docs/checkpoint-layouts.md, "Experts grouped on the
    /// CPU"). Float32 stacks are grouped too, but in products of a fixed row count
    /// ([`Experts::cpu_float32_stack`]): a product over all of an expert's tokens rounds a row
    /// differently with its row count on OpenBLAS (the same docs say what that costs bf16).
    pub(crate) fn cpu_dense_matrices(&self) -> Result<Option<Vec<Array>>, ModelError> {
        let Experts::Dense { weight } = self else {
            return Ok(None);
        };
        if !widened::widens(weight.dtype())? {
            return Ok(None);
        }
        let shape = weight.shape();
        let [experts, out, inner] = shape[..] else {
            return Err(ModelError::Shape("dense experts are not [E, out, in]"));
        };
        let matrices = if experts == 1 {
            vec![weight.clone()]
        } else {
            weight.split_equal(experts, 0)?
        };
        matrices
            .into_iter()
            .map(|m| Ok(m.reshape(&[out, inner])?))
            .collect::<Result<Vec<_>, ModelError>>()
            .map(Some)
    }

    /// For a dense float32 stack on MLX's CPU backend, the stack `[E, out, in]`, for products
    /// grouped by expert in tiles of a fixed row count (`Moe::tiled_on_host`); `None` for
    /// narrower and quantised stacks and on a GPU.
    pub(crate) fn cpu_float32_stack(&self) -> Result<Option<&Array>, ModelError> {
        match self {
            Experts::Dense { weight }
                if weight.dtype() == Dtype::Float32 && widened::cpu_backend()? =>
            {
                Ok(Some(weight))
            }
            _ => Ok(None),
        }
    }

    fn gather(&self, x: &Array, idx: &Array, sorted: bool) -> Result<Array, ModelError> {
        let dtype = x.dtype();
        match self {
            Experts::Dense { weight } => {
                if !widened::widens(weight.dtype())? {
                    widened::note_native(&[weight]);
                    let y = ops::gather_mm(
                        &x.as_dtype(weight.dtype())?,
                        &weight.swap_axes(-1, -2)?,
                        None,
                        idx,
                        sorted,
                    )?;
                    return Ok(y.as_dtype(dtype)?);
                }
                // MLX's CPU `gather_mm` runs float32 only: the stack is widened per call, a
                // slice of every expert's output rows at a time (`widened`), never whole.
                // (`Moe::forward` groups dense experts by expert on the CPU instead; this is
                // the path of a caller that does not.)
                widened::note(widened::Path::Widened);
                widened::sliced(
                    &x.as_dtype(Dtype::Float32)?,
                    weight,
                    1,
                    widened::EXPERT_SLICE_VALUES,
                    dtype,
                    |x, w| Ok(ops::gather_mm(x, &w.swap_axes(-1, -2)?, None, idx, sorted)?),
                )
            }
            // Float32 on the CPU, for speed (`Affine::run_kernel`).
            Experts::Affine(q) => q.run_kernel(x, |x, scales, biases| {
                ops::gather_qmm(
                    x,
                    &q.weight,
                    scales,
                    biases,
                    None,
                    idx,
                    true,
                    q.group_size,
                    q.bits,
                    sorted,
                )
            }),
            Experts::Nvfp4 {
                weight,
                scales,
                global_scale,
            } => {
                // mlx-c 0.7.0's gather_qmm has no global_scale argument (and MLX's CPU backend
                // refuses one anyway), so: matmul with the block scales only, in float32, then
                // scale each expert's output rows by global_scale[expert] / 2688.
                let x32 = x.as_dtype(Dtype::Float32)?;
                widened::note(widened::Path::Native(Dtype::Float32));
                let y = gather_qmm_nvfp4(&x32, weight, scales, idx, sorted)?;
                let gs = ops::divide(
                    global_scale.take_axis(idx, 0)?,
                    Array::from_f32(NVFP4_GLOBAL_SCALE_DIVISOR),
                )?;
                // One scale per pair, broadcast over its output row: `idx`'s shape + [1, 1].
                let mut shape = idx.shape().to_vec();
                shape.extend([1, 1]);
                let gs = gs.reshape(&shape)?;
                Ok(ops::multiply(y, gs)?.as_dtype(dtype)?)
            }
        }
    }
}

/// Makes mlx-rs install its error handler (it does so on its first safe op), so a failing raw
/// mlx-c call reports through it instead of mlx-c's default handler, which exits the process.
fn ensure_mlx_error_handler() -> Result<(), ModelError> {
    let _ = Array::from_int(0).as_dtype(Dtype::Int32)?;
    Ok(())
}

fn nvfp4_mode() -> CString {
    CString::from(c"nvfp4")
}

fn optional_int(value: i32) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int {
        value,
        has_value: true,
    }
}

/// `mx.quantize(w, 16, 4, mode="nvfp4", global_scale=gs)` for one matrix (or a stack sharing one
/// scalar `global_scale`): returns (uint32 codes `[..., in/8]`, uint8 E4M3 scales `[..., in/16]`).
/// For conversion tools and tests; MLX only accepts a scalar global scale here.
pub fn quantize_nvfp4(w: &Array, global_scale: f32) -> Result<(Array, Array), ModelError> {
    ensure_mlx_error_handler()?;
    let mode = nvfp4_mode();
    let gs = Array::from_f32(global_scale);
    let stream = mlx_rs::Stream::thread_local_or_default();
    // SAFETY: all handles are live for the call; the result vector is freed after its two
    // arrays have been taken out (each `get` hands back a new reference we own).
    unsafe {
        let mut res = mlx_sys::mlx_vector_array_new();
        let status = mlx_sys::mlx_quantize(
            &mut res,
            w.as_ptr(),
            optional_int(16),
            optional_int(4),
            mode.as_ptr(),
            gs.as_ptr(),
            stream.as_ptr(),
        );
        let mut out = Vec::new();
        if status == 0 {
            for i in 0..mlx_sys::mlx_vector_array_size(res) {
                let mut a = mlx_sys::mlx_array_new();
                mlx_sys::mlx_vector_array_get(&mut a, res, i);
                out.push(Array::from_ptr(a));
            }
        }
        mlx_sys::mlx_vector_array_free(res);
        if status != 0 || out.len() < 2 {
            return Err(ModelError::Nvfp4(format!(
                "mlx_quantize(mode=nvfp4) failed for w {:?}",
                w.shape()
            )));
        }
        let scales = out.swap_remove(1);
        let codes = out.swap_remove(0);
        Ok((codes, scales))
    }
}

/// `mx.dequantize(codes, scales, 16, 4, mode="nvfp4", global_scale=gs)` → float32.
pub fn dequantize_nvfp4(
    codes: &Array,
    scales: &Array,
    global_scale: f32,
) -> Result<Array, ModelError> {
    let gs = Array::from_f32(global_scale);
    nvfp4_call(
        |res, none, mode, stream| {
            // SAFETY: as in `nvfp4_call`.
            unsafe {
                mlx_sys::mlx_dequantize(
                    res,
                    codes.as_ptr(),
                    scales.as_ptr(),
                    none,
                    optional_int(16),
                    optional_int(4),
                    mode,
                    gs.as_ptr(),
                    mlx_sys::mlx_optional_dtype {
                        value: Dtype::Float32 as mlx_sys::mlx_dtype,
                        has_value: true,
                    },
                    stream,
                )
            }
        },
        || {
            format!(
                "mlx_dequantize(mode=nvfp4) failed for codes {:?}",
                codes.shape()
            )
        },
    )
}

/// `gather_qmm` in mode "nvfp4" (group 16, 4 bits, transposed weights), which mlx-rs's safe API
/// cannot express because it hard-codes mode "affine".
pub fn gather_qmm_nvfp4(
    x: &Array,
    w: &Array,
    scales: &Array,
    rhs_indices: &Array,
    sorted_indices: bool,
) -> Result<Array, ModelError> {
    nvfp4_call(
        |res, none, mode, stream| {
            // SAFETY: as in `nvfp4_call`.
            unsafe {
                mlx_sys::mlx_gather_qmm(
                    res,
                    x.as_ptr(),
                    w.as_ptr(),
                    scales.as_ptr(),
                    none,
                    none,
                    rhs_indices.as_ptr(),
                    true,
                    optional_int(16),
                    optional_int(4),
                    mode,
                    sorted_indices,
                    stream,
                )
            }
        },
        || {
            format!(
                "mlx_gather_qmm(mode=nvfp4) failed for x {:?}, w {:?}, scales {:?}",
                x.shape(),
                w.shape(),
                scales.shape()
            )
        },
    )
}

/// Runs one raw mlx-c call in mode "nvfp4" that yields one array: `call` gets the result handle
/// to fill, an empty array for mlx-c's "null" optional inputs, the mode and the stream, and
/// returns mlx-c's status; `what` says what failed.
fn nvfp4_call(
    call: impl FnOnce(
        &mut mlx_sys::mlx_array,
        mlx_sys::mlx_array,
        *const std::ffi::c_char,
        mlx_sys::mlx_stream,
    ) -> std::ffi::c_int,
    what: impl FnOnce() -> String,
) -> Result<Array, ModelError> {
    ensure_mlx_error_handler()?;
    let mode = nvfp4_mode();
    let stream = mlx_rs::Stream::thread_local_or_default();
    // SAFETY: every handle `call` passes on is a live mlx_array owned by its caller for the
    // duration of the call; the empty array stands for mlx-c's "null" optional inputs; `res` is
    // a fresh handle that we take ownership of below whether or not the call succeeded.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let none = mlx_sys::mlx_array_new();
        let status = call(&mut res, none, mode.as_ptr(), stream.as_ptr());
        mlx_sys::mlx_array_free(none);
        let out = Array::from_ptr(res);
        if status != 0 {
            return Err(ModelError::Nvfp4(what()));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use mlx_rs::{ops, random, Array};

    use super::*;
    use crate::model::linear::Linear;

    const E: i32 = 4;
    const OUT: i32 = 32;
    const IN: i32 = 64;

    fn max_abs(a: &Array, b: &Array) -> Result<f32, ModelError> {
        let d = ops::abs(ops::subtract(a, b)?)?.max(None)?;
        Ok(d.as_dtype(Dtype::Float32)?.item_exact::<f32>())
    }

    fn inputs() -> Result<(Array, Array, Array), ModelError> {
        let key = random::key(7)?;
        let w = random::normal::<f32>(&[E, OUT, IN][..], None, 0.05, &key)?;
        let x = random::normal::<f32>(&[5, 1, 1, IN][..], None, None, &random::key(8)?)?;
        let idx = Array::from_slice(&[0u32, 3, 1, 1, 2, 0, 3, 2, 1, 0], &[5, 2]);
        Ok((w, x, idx))
    }

    #[test]
    fn nvfp4_experts_match_dequantised_dense() -> Result<(), ModelError> {
        let (w, x, idx) = inputs()?;
        let mut codes = Vec::new();
        let mut scales = Vec::new();
        let mut dense = Vec::new();
        let mut gs = Vec::new();
        for e in 0..E {
            let we = w.take_axis(Array::from_int(e), 0)?;
            // Per-expert abs-max global scale, as mlx-lm's converter does; expert e gets a
            // different scale so a wrong gather of global_scale shows.
            let g = ops::abs(&we)?.max(None)?.item_exact::<f32>() * (1.0 + e as f32);
            let (c, s) = quantize_nvfp4(&we, g)?;
            dense.push(dequantize_nvfp4(&c, &s, g)?);
            codes.push(c);
            scales.push(s);
            gs.push(g);
        }
        let nv = Experts::nvfp4(
            ops::stack(&codes, 0)?,
            ops::stack(&scales, 0)?,
            Array::from_slice(&gs, &[E]),
        )?;
        let reference = Experts::dense(ops::stack(&dense, 0)?)?;
        let got = nv.forward(&x, &idx)?;
        let want = reference.forward(&x, &idx)?;
        assert_eq!(got.shape(), &[5, 2, 1, OUT]);
        let d = max_abs(&got, &want)?;
        eprintln!("nvfp4 experts vs dequantised dense: {d:e}");
        assert!(d < 1e-4, "nvfp4 vs dequantised dense: {d}");
        Ok(())
    }

    #[test]
    fn affine_experts_match_dequantised_dense() -> Result<(), ModelError> {
        let (w, x, idx) = inputs()?;
        let (q, s, b) = ops::quantize(&w, 64, 4)?;
        let deq = ops::dequantize(&q, &s, &b, 64, 4)?;
        let got = Experts::affine(q, s, b, 64, 4).forward(&x, &idx)?;
        let want = Experts::dense(deq)?.forward(&x, &idx)?;
        let d = max_abs(&got, &want)?;
        eprintln!("affine experts vs dequantised dense: {d:e}");
        assert!(d < 1e-4, "affine vs dequantised dense: {d}");
        Ok(())
    }

    /// With bfloat16 activations and scales, the CPU computes affine products in float32
    /// (`Affine::run_kernel`): the result is the float32 product of the widened inputs,
    /// rounded once to bfloat16, bit for bit, and close to the dense float32 product.
    #[test]
    fn bf16_affine_products_run_in_f32_on_the_cpu() -> Result<(), ModelError> {
        let (w, x, idx) = inputs()?;
        let (q, s, b) = ops::quantize(&w.as_dtype(Dtype::Bfloat16)?, 64, 4)?;
        assert_eq!(s.dtype(), Dtype::Bfloat16);
        let x16 = x.as_dtype(Dtype::Bfloat16)?;
        let wide = |a: &Array| a.as_dtype(Dtype::Float32);
        let experts = Experts::affine(q.clone(), s.clone(), b.clone(), 64, 4);
        let got = experts.forward(&x16, &idx)?;
        assert_eq!(got.dtype(), Dtype::Bfloat16);
        let f32_product = Experts::affine(q.clone(), wide(&s)?, wide(&b)?, 64, 4)
            .forward(&wide(&x16)?, &idx)?
            .as_dtype(Dtype::Bfloat16)?;
        assert_eq!(
            max_abs(&got, &f32_product)?,
            0.0,
            "experts: one rounding of f32"
        );
        let deq = ops::dequantize(&q, &wide(&s)?, &wide(&b)?, 64, 4)?;
        let dense = Experts::dense(deq)?.forward(&wide(&x16)?, &idx)?;
        let d = max_abs(&got, &dense)?;
        let scale = ops::abs(&dense)?
            .max(None)?
            .as_dtype(Dtype::Float32)?
            .item_exact::<f32>();
        assert!(
            d <= scale / 128.0,
            "experts vs dense f32: {d} (max {scale})"
        );

        let w0 = w
            .take_axis(Array::from_int(0), 0)?
            .as_dtype(Dtype::Bfloat16)?;
        let (q, s, b) = ops::quantize(&w0, 64, 8)?;
        let x16 = random::normal::<f32>(&[3, IN][..], None, None, &random::key(9)?)?
            .as_dtype(Dtype::Bfloat16)?;
        // `forward_transposed` takes `[.., out]` (self-conditioning's soft embedding).
        let p16 = random::normal::<f32>(&[3, OUT][..], None, None, &random::key(10)?)?
            .as_dtype(Dtype::Bfloat16)?;
        let linear = Linear::affine(q.clone(), s.clone(), b.clone(), 64, 8);
        let wide_linear = Linear::affine(q, wide(&s)?, wide(&b)?, 64, 8);
        for (got, want) in [
            (linear.forward(&x16)?, wide_linear.forward(&wide(&x16)?)?),
            (
                linear.forward_transposed(&p16)?,
                wide_linear.forward_transposed(&wide(&p16)?)?,
            ),
        ] {
            assert_eq!(got.dtype(), Dtype::Bfloat16);
            let want = want.as_dtype(Dtype::Bfloat16)?;
            assert_eq!(max_abs(&got, &want)?, 0.0, "linear: one rounding of f32");
        }
        Ok(())
    }

    #[test]
    fn affine_linear_matches_dequantised_dense() -> Result<(), ModelError> {
        let (w, _, _) = inputs()?;
        let w = w.take_axis(Array::from_int(0), 0)?;
        let x = random::normal::<f32>(&[3, IN][..], None, None, &random::key(9)?)?;
        let (q, s, b) = ops::quantize(&w, 64, 8)?;
        let deq = ops::dequantize(&q, &s, &b, 64, 8)?;
        let quant = Linear::affine(q, s, b, 64, 8);
        let dense = Linear::dense(deq);
        let d = max_abs(&quant.forward(&x)?, &dense.forward(&x)?)?;
        eprintln!("affine linear vs dequantised dense: {d:e}");
        assert!(d < 1e-4, "affine linear: {d}");
        let ids = Array::from_slice(&[1u32, 5], &[2]);
        let d = max_abs(&quant.rows(&ids)?, &dense.rows(&ids)?)?;
        assert!(d < 1e-5, "affine rows: {d}");
        Ok(())
    }
}
