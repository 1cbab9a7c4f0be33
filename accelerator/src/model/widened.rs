//! Dense products of bfloat16 (or float16) weights in float32 on MLX's CPU backend, widened per
//! call, one bounded slice of the weight at a time.
//!
//! MLX 0.32's CPU backend multiplies bfloat16 matrices with a portable blocked loop (no BLAS, and
//! on x86 no vector code), 4–5x slower than its float32 products, which go to the BLAS
//! (docs/benchmarks.md, "bfloat16 against float32 on the CPU"); `gather_mm` refuses anything but
//! float32. So on the CPU a narrow weight is widened for the product and the result cast back,
//! as the affine products already are (`Affine::run_kernel`): the weight stays stored in
//! bfloat16, and each output is the float32 product rounded once.
//!
//! Widening a whole weight at once would add twice its bytes to memory for the call: 2.9 GB for
//! the tied head of a 262k vocabulary, 2 GB for one layer's `gate_up` experts. So the weight is
//! widened in slices along its output axis, and each slice's widening is made to depend on the
//! previous slice's product, the first on the product's input (MLX's `depends`). MLX's scheduler
//! orders a graph breadth-first, so casts that depend only on loaded weights would otherwise run
//! side by side, for every layer, before the products that read them; chained, a weight's
//! slices are widened one after the other, as the pass reaches it.
//!
//! The slices of a dense product are small enough to stay in the processor's cache between the
//! cast that writes them and the product that reads them ([`DENSE_SLICE_VALUES`], 2 MiB in
//! float32): then widening costs a pass over the bf16 bytes and little more memory traffic, which
//! matters most to a product with few rows (a decoder pass over one canvas, the head at the
//! label slots), bound by reading its weight. Slices of 64 MiB went through main memory twice
//! more (written, then read): at full width a decoder pass with the 262k-row head took 16% more
//! CPU time with them (docs/benchmarks.md). `Moe::forward` groups bf16 experts by expert on the
//! CPU, so each chosen expert's matrices are dense weights here, in dense slices. A whole stack
//! through `Experts::forward` (`gather_mm`) takes larger slices
//! ([`EXPERT_SLICE_VALUES`], 16 MiB): they are cut along each expert's output rows, and
//! `gather_mm` runs one product per (token, expert) pair and slice, so the smaller the slice the
//! more and narrower the calls. At full width (128 experts) a 16 MiB slice holds 11 rows of each
//! expert; measured there, 16 MiB slices took a decoder pass 25% and a prefill 5% less CPU time
//! than 64 MiB ones, and 4 MiB slices (2 rows each) less than 64 MiB but more than 16 MiB.

use mlx_rs::{ops, Array, Dtype};

use super::ModelError;

/// Whether the default device is MLX's CPU backend.
pub(crate) fn cpu_backend() -> Result<bool, ModelError> {
    Ok(matches!(
        mlx_rs::Device::try_default()?.get_type()?,
        mlx_rs::DeviceType::Cpu
    ))
}

/// Values per widened slice of a dense weight: 512 Ki, 2 MiB in float32 (a processor's L2 or a
/// share of its L3 cache).
pub const DENSE_SLICE_VALUES: i64 = 1 << 19;

/// Values per widened slice of an expert stack: 4 Mi, 16 MiB in float32 (a share of a last-level
/// cache; the module docs say why not smaller).
pub const EXPERT_SLICE_VALUES: i64 = 1 << 22;

/// Whether a product with a weight of `dtype` is computed by widening on this backend: the
/// weight is narrower than float32 and MLX runs on the CPU.
pub(crate) fn widens(dtype: Dtype) -> Result<bool, ModelError> {
    Ok(matches!(dtype, Dtype::Bfloat16 | Dtype::Float16) && cpu_backend()?)
}

/// Output ranges `[start, end)` that split `out` outputs into slices of at most `max_values`
/// values, each output having `per_output` values (an output wider than that is a slice alone).
pub(crate) fn slice_bounds(out: i32, per_output: i64, max_values: i64) -> Vec<i32> {
    let rows = (max_values / per_output.max(1)).clamp(1, i64::from(out.max(1))) as i32;
    (1..).map(|i| i * rows).take_while(|&b| b < out).collect()
}

/// `first` made to depend on `after`: the same values, computed only once `after` is.
pub(crate) fn after(first: &Array, after: &Array) -> Result<Array, ModelError> {
    // SAFETY: the vectors hold new references to live arrays for the call and are freed after
    // it; the result vector's single array is taken out (a new reference we own) before the
    // vector is freed.
    unsafe {
        let inputs = mlx_sys::mlx_vector_array_new_data(&first.as_ptr(), 1);
        let deps = mlx_sys::mlx_vector_array_new_data(&after.as_ptr(), 1);
        let mut res = mlx_sys::mlx_vector_array_new();
        let status = mlx_sys::mlx_depends(&mut res, inputs, deps);
        mlx_sys::mlx_vector_array_free(inputs);
        mlx_sys::mlx_vector_array_free(deps);
        let mut out = None;
        if status == 0 && mlx_sys::mlx_vector_array_size(res) == 1 {
            let mut a = mlx_sys::mlx_array_new();
            mlx_sys::mlx_vector_array_get(&mut a, res, 0);
            out = Some(Array::from_ptr(a));
        }
        mlx_sys::mlx_vector_array_free(res);
        out.ok_or(ModelError::Shape("mlx_depends failed"))
    }
}

/// Runs `product(x32, slice32)` for each widened slice of `weight` along `axis` (the weight's
/// output axis), slices of at most `max_values` values, in order, the first slice widened only
/// once `x32` is computed and each later one only after the previous product, and joins the
/// results (cast to `result`) along the last axis.
pub(crate) fn sliced(
    x32: &Array,
    weight: &Array,
    axis: i32,
    max_values: i64,
    result: Dtype,
    product: impl Fn(&Array, &Array) -> Result<Array, ModelError>,
) -> Result<Array, ModelError> {
    let shape = weight.shape();
    let axis_index = if axis < 0 {
        shape.len() as i32 + axis
    } else {
        axis
    } as usize;
    let out = shape[axis_index];
    let per_output: i64 = weight.size() as i64 / i64::from(out.max(1));
    let bounds = slice_bounds(out, per_output, max_values);
    let slices = if bounds.is_empty() {
        vec![weight.clone()]
    } else {
        weight.split_at_indices(&bounds, axis)?
    };
    // The first slice waits for the activations: a widening that depends on nothing but a
    // loaded weight could otherwise be scheduled at the start of the pass, for every layer.
    let mut previous = x32.clone();
    let mut parts = Vec::with_capacity(slices.len());
    for slice in &slices {
        let y = product(x32, &after(slice, &previous)?.as_dtype(Dtype::Float32)?)?;
        parts.push(y.as_dtype(result)?);
        previous = y;
    }
    if parts.len() == 1 {
        return Ok(parts.swap_remove(0));
    }
    Ok(ops::concatenate(&parts, -1)?)
}

/// `x · Wᵀ` (`transpose`) or `x · W` for a dense `weight` `[out, in]`, with the float32 BLAS
/// where MLX's CPU would otherwise run its bfloat16 loop; the result has `x`'s dtype.
pub(crate) fn dense_matmul(
    x: &Array,
    weight: &Array,
    transpose: bool,
) -> Result<Array, ModelError> {
    if widens(weight.dtype())? {
        note(Path::Widened);
    } else {
        note_native(&[x, weight]);
    }
    dense_matmul_uncounted(x, weight, transpose)
}

/// [`dense_matmul`] without counting the product in [`take_product_paths`]: for a caller that
/// runs one logical product as several (the experts grouped by expert, `model::diffusion_gemma::moe`) and counts
/// it once itself.
pub(crate) fn dense_matmul_uncounted(
    x: &Array,
    weight: &Array,
    transpose: bool,
) -> Result<Array, ModelError> {
    if !widens(weight.dtype())? {
        return Ok(if transpose {
            ops::matmul(x, weight.t())?
        } else {
            ops::matmul(x, weight)?
        });
    }
    let result = x.dtype();
    let x32 = x.as_dtype(Dtype::Float32)?;
    if transpose {
        // Slices of W's rows: each gives a run of the outputs.
        sliced(&x32, weight, 0, DENSE_SLICE_VALUES, result, |x, w| {
            Ok(ops::matmul(x, w.t())?)
        })
    } else {
        // Slices of W's columns (the outputs of `x · W`).
        sliced(&x32, weight, 1, DENSE_SLICE_VALUES, result, |x, w| {
            Ok(ops::matmul(x, w)?)
        })
    }
}

/// The way a product is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Narrow operands widened to float32 for the call (slice by slice for a weight).
    Widened,
    /// One of MLX's kernels as it is, on operands of the given dtype.
    Native(Dtype),
}

/// How many products of each path the graphs built on this thread have had since the last
/// [`take_product_paths`]: counted as the graph is built, so a test can pin which path every
/// product of a pass takes (a count, not a timing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProductPaths {
    /// Products whose narrow operands were widened to float32 for the call.
    pub widened: u32,
    /// Products run natively with an operand narrower than float32 (bfloat16 or float16).
    pub narrow: u32,
    /// Products run natively on float32 (or wider, or integer-coded) operands.
    pub float32: u32,
}

thread_local! {
    static PATHS: std::cell::Cell<ProductPaths> = const {
        std::cell::Cell::new(ProductPaths { widened: 0, narrow: 0, float32: 0 })
    };
}

/// The counts since the last call on this thread, which it resets.
pub fn take_product_paths() -> ProductPaths {
    PATHS.with(|p| p.take())
}

/// Counts one product built on `path`.
pub(crate) fn note(path: Path) {
    PATHS.with(|p| {
        let mut c = p.get();
        // Nobody takes the counts in a server: saturate rather than overflow.
        let count = match path {
            Path::Widened => &mut c.widened,
            Path::Native(Dtype::Bfloat16 | Dtype::Float16) => &mut c.narrow,
            Path::Native(_) => &mut c.float32,
        };
        *count = count.saturating_add(1);
        p.set(c);
    });
}

/// Counts one native product on `operands`: narrow if any floating operand is.
pub(crate) fn note_native(operands: &[&Array]) {
    let narrow = operands
        .iter()
        .map(|a| a.dtype())
        .find(|d| matches!(d, Dtype::Bfloat16 | Dtype::Float16));
    note(Path::Native(narrow.unwrap_or(Dtype::Float32)));
}

#[cfg(test)]
mod tests {
    use mlx_rs::{ops, random, Array, Dtype};

    use super::*;

    fn max_abs(a: &Array, b: &Array) -> Result<f32, ModelError> {
        let d = ops::abs(ops::subtract(
            a.as_dtype(Dtype::Float32)?,
            b.as_dtype(Dtype::Float32)?,
        )?)?
        .max(None)?;
        Ok(d.item_exact::<f32>())
    }

    #[test]
    fn slices_cover_the_outputs_within_the_bound() {
        // The tied head, 262,144 rows of 2,816: 186 rows (524k values, 2 MiB in f32) per slice.
        let b = slice_bounds(262_144, 2816, DENSE_SLICE_VALUES);
        let rows = DENSE_SLICE_VALUES / 2816;
        assert_eq!(rows, 186);
        assert_eq!(b[0] as i64, rows);
        assert!(b.windows(2).all(|w| (w[1] - w[0]) as i64 == rows));
        assert!(262_144 - *b.last().unwrap_or(&0) as i64 <= rows);
        // A full-width `gate_up` stack cut along its 1,408 output rows, each 128 × 2,816 values:
        // 11 rows (4.0M values) per slice.
        let e = slice_bounds(1408, 128 * 2816, EXPERT_SLICE_VALUES);
        assert_eq!(e[0], 11);
        assert_eq!(e.len(), 127);
        // A small weight is one slice; a row wider than the bound is a slice of its own.
        assert!(slice_bounds(186, 2816, DENSE_SLICE_VALUES).is_empty());
        assert_eq!(
            slice_bounds(3, DENSE_SLICE_VALUES * 2, DENSE_SLICE_VALUES),
            vec![1, 2]
        );
    }

    /// The bfloat16 product on the CPU is the float32 product of the same (bf16) values rounded
    /// once to bfloat16, bit for bit, also when the weight is cut into several slices; and it
    /// is within one bf16 rounding of the float32 model's product.
    #[test]
    fn bf16_dense_products_are_the_f32_product_rounded_once() -> Result<(), ModelError> {
        // 5 rows of 2^17 values: two slices, of 4 rows (DENSE_SLICE_VALUES / 2^17) and 1.
        let (out, inner) = (5, 1 << 17);
        let w32 = random::normal::<f32>(&[out, inner][..], None, 0.02, &random::key(1)?)?;
        let x32 = random::normal::<f32>(&[3, inner][..], None, None, &random::key(2)?)?;
        assert_eq!(slice_bounds(out, inner as i64, DENSE_SLICE_VALUES), vec![4]);
        let w16 = w32.as_dtype(Dtype::Bfloat16)?;
        let x16 = x32.as_dtype(Dtype::Bfloat16)?;
        let got = dense_matmul(&x16, &w16, true)?;
        assert_eq!(got.dtype(), Dtype::Bfloat16);
        assert_eq!(got.shape(), &[3, out]);
        let wide = |a: &Array| a.as_dtype(Dtype::Float32);
        let f32_of_bf16 = ops::matmul(wide(&x16)?, wide(&w16)?.t())?;
        assert_eq!(
            max_abs(&got, &f32_of_bf16.as_dtype(Dtype::Bfloat16)?)?,
            0.0,
            "one rounding of the f32 product"
        );
        // Against the float32 model (unrounded weights and inputs): the inputs' rounding
        // (2^-9 relative each) dominates; bound it by 2^-7 of the largest output.
        let f32_model = ops::matmul(&x32, w32.t())?;
        let scale = ops::abs(&f32_model)?.max(None)?.item_exact::<f32>();
        let d = max_abs(&got, &f32_model)?;
        eprintln!("bf16 dense vs f32 model: {d:e} (max |y| {scale})");
        assert!(d <= scale / 128.0, "bf16 vs f32 model: {d} (max {scale})");

        // `x · W` (self-conditioning's soft embedding): slices of columns, here three.
        let p16 = random::normal::<f32>(&[2, out][..], None, None, &random::key(3)?)?
            .as_dtype(Dtype::Bfloat16)?;
        let w_t = random::normal::<f32>(&[out, 300_000][..], None, 0.02, &random::key(4)?)?
            .as_dtype(Dtype::Bfloat16)?;
        assert_eq!(
            slice_bounds(300_000, out as i64, DENSE_SLICE_VALUES).len(),
            2
        );
        let got = dense_matmul(&p16, &w_t, false)?;
        let want = ops::matmul(wide(&p16)?, wide(&w_t)?)?.as_dtype(Dtype::Bfloat16)?;
        assert_eq!(max_abs(&got, &want)?, 0.0, "x · W: one rounding of f32");
        Ok(())
    }

    /// The model's own paths take it: a dense `Linear` and dense experts with bf16 weights
    /// give the float32 product rounded once.
    #[test]
    fn bf16_linear_and_experts_take_the_f32_path() -> Result<(), ModelError> {
        let wide = |a: &Array| a.as_dtype(Dtype::Float32);
        let w = random::normal::<f32>(&[4, 24, 64][..], None, 0.05, &random::key(7)?)?
            .as_dtype(Dtype::Bfloat16)?;
        let x = random::normal::<f32>(&[5, 1, 1, 64][..], None, None, &random::key(8)?)?
            .as_dtype(Dtype::Bfloat16)?;
        let idx = Array::from_slice(&[0u32, 3, 1, 1, 2, 0, 3, 2, 1, 0], &[5, 2]);
        let got = crate::model::Experts::dense(w.clone())?.forward(&x, &idx)?;
        assert_eq!(got.dtype(), Dtype::Bfloat16);
        let want = ops::gather_mm(wide(&x)?, wide(&w)?.swap_axes(-1, -2)?, None, &idx, false)?
            .as_dtype(Dtype::Bfloat16)?;
        assert_eq!(max_abs(&got, &want)?, 0.0, "experts: one rounding of f32");

        let w0 = w.take_axis(Array::from_int(0), 0)?;
        let x2 = x.reshape(&[5, 64])?;
        let got = crate::model::Linear::dense(w0.clone()).forward(&x2)?;
        let want = ops::matmul(wide(&x2)?, wide(&w0)?.t())?.as_dtype(Dtype::Bfloat16)?;
        assert_eq!(max_abs(&got, &want)?, 0.0, "linear: one rounding of f32");
        Ok(())
    }

    /// A float32 weight is multiplied as it is (nothing widened, one product).
    #[test]
    fn f32_weights_are_not_sliced() -> Result<(), ModelError> {
        let w = random::normal::<f32>(&[8, 16][..], None, None, &random::key(5)?)?;
        let x = random::normal::<f32>(&[2, 16][..], None, None, &random::key(6)?)?;
        let got = dense_matmul(&x, &w, true)?;
        assert_eq!(max_abs(&got, &ops::matmul(&x, w.t())?)?, 0.0);
        assert!(!widens(Dtype::Float32)?);
        Ok(())
    }
}
