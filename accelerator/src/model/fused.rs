//! Elementwise chains fused into one kernel with MLX's `compile`, and the scalar constants the
//! model multiplies by, each made once instead of once per forward (docs/model.md, "Fused
//! elementwise chains").
//!
//! Why thread-local: a compiled function belongs to MLX's compile cache of the thread that made
//! it and is not `Send`, while the model is moved into the engine thread after loading. Each
//! thread that runs the model (the engine thread; test threads) compiles once, on first use, and
//! keeps the compiled function and the constants for its lifetime.
//!
//! Why the answers do not change: a fused kernel computes the same operations in the same order
//! and dtypes as the separate ones (`fused_equals_plain` checks bit-equality on this backend),
//! and it is elementwise, so each row stays independent of the others in a batch. MLX's own
//! switch `MLX_DISABLE_COMPILE=1` runs the traced operations unfused, for comparison.

use std::cell::RefCell;
use std::collections::HashMap;

use mlx_rs::{error::Exception, ops, transforms::compile::compile, Array, Dtype};

use super::ModelError;

/// The cubic coefficient of `gelu_pytorch_tanh`.
const GELU_CUBIC: f32 = 0.044_715;

type Fused = Box<dyn for<'a> FnMut(&'a [Array]) -> Result<Vec<Array>, Exception>>;

thread_local! {
    /// Scalar constants by (value bits, dtype), evaluated once.
    static CONSTANTS: RefCell<HashMap<(u32, Dtype), Array>> = RefCell::new(HashMap::new());
    /// `gelu_tanh(gate) ⊙ up`.
    static GEGLU: RefCell<Fused> = RefCell::new(Box::new(compile(geglu_graph, true)));
    /// `tanh(x / cap) · cap`.
    static SOFTCAP: RefCell<Fused> = RefCell::new(Box::new(compile(softcap_graph, true)));
}

/// The scalar `value` in `dtype` (rounded as `as_dtype` rounds it), made once per thread.
pub fn constant(value: f32, dtype: Dtype) -> Result<Array, ModelError> {
    CONSTANTS.with(|constants| {
        let key = (value.to_bits(), dtype);
        if let Some(made) = constants.borrow().get(&key) {
            return Ok(made.clone());
        }
        let made = Array::from_f32(value).as_dtype(dtype)?;
        made.eval()?;
        constants.borrow_mut().insert(key, made.clone());
        Ok(made)
    })
}

/// `gelu_pytorch_tanh`: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, the constants in `x`'s
/// dtype (the reference computes in the activation dtype).
fn gelu_tanh_of(x: &Array, c: &[Array]) -> Result<Array, Exception> {
    let [cubic, sqrt_2_over_pi, one, half] = c else {
        return Err(Exception::custom("gelu_tanh takes four constants"));
    };
    let x3 = ops::multiply(ops::multiply(x, x)?, x)?;
    let inner = ops::multiply(ops::add(x, ops::multiply(x3, cubic)?)?, sqrt_2_over_pi)?;
    let t = ops::add(ops::tanh(inner)?, one)?;
    ops::multiply(ops::multiply(x, t)?, half)
}

/// The traced GeGLU: inputs `[gate, up, cubic, √(2/π), 1, ½]`.
fn geglu_graph(inputs: &[Array]) -> Result<Vec<Array>, Exception> {
    let [gate, up, constants @ ..] = inputs else {
        return Err(Exception::custom("geglu takes gate, up and four constants"));
    };
    Ok(vec![ops::multiply(gelu_tanh_of(gate, constants)?, up)?])
}

/// The traced softcap: inputs `[x, cap]`.
fn softcap_graph(inputs: &[Array]) -> Result<Vec<Array>, Exception> {
    let [x, cap] = inputs else {
        return Err(Exception::custom("softcap takes x and cap"));
    };
    Ok(vec![ops::multiply(ops::tanh(ops::divide(x, cap)?)?, cap)?])
}

fn gelu_constants(dtype: Dtype) -> Result<[Array; 4], ModelError> {
    Ok([
        constant(GELU_CUBIC, dtype)?,
        // √(2/π), rounded from f64 as the reference rounds it.
        constant((2.0f64 / std::f64::consts::PI).sqrt() as f32, dtype)?,
        constant(1.0, dtype)?,
        constant(0.5, dtype)?,
    ])
}

fn first(mut outputs: Vec<Array>) -> Result<Array, ModelError> {
    outputs
        .pop()
        .ok_or(ModelError::Shape("a fused chain returned nothing"))
}

/// `gelu_tanh(gate) ⊙ up` as one fused kernel (both in the activation dtype).
pub fn geglu(gate: &Array, up: &Array) -> Result<Array, ModelError> {
    let [a, b, c, d] = gelu_constants(gate.dtype())?;
    let inputs = [gate.clone(), up.clone(), a, b, c, d];
    first(GEGLU.with(|f| (f.borrow_mut())(&inputs))?)
}

/// `tanh(x / cap) · cap` as one fused kernel, `cap` in `x`'s dtype.
pub fn softcap(x: &Array, cap: f32) -> Result<Array, ModelError> {
    let inputs = [x.clone(), constant(cap, x.dtype())?];
    first(SOFTCAP.with(|f| (f.borrow_mut())(&inputs))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gelu_tanh(x)` unfused: the separate operations the fused kernel must equal.
    fn gelu_tanh(x: &Array) -> Result<Array, ModelError> {
        Ok(gelu_tanh_of(x, &gelu_constants(x.dtype())?)?)
    }

    fn random(shape: &[i32], dtype: Dtype, seed: u64) -> Array {
        let key = mlx_rs::random::key(seed).expect("key");
        mlx_rs::random::normal::<f32>(shape, None, None, &key)
            .and_then(|a| a.multiply(Array::from_f32(3.0)))
            .and_then(|a| a.as_dtype(dtype))
            .expect("random")
    }

    fn bits_equal(a: &Array, b: &Array) -> bool {
        a.shape() == b.shape()
            && a.dtype() == b.dtype()
            && ops::array_eq(a, b, false)
                .expect("compare")
                .as_slice::<bool>()
                == [true]
    }

    #[test]
    fn fused_equals_plain() {
        // Several shapes through the same compiled function (it is shapeless), both dtypes.
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            for (i, shape) in [[1, 7, 64], [2, 16, 160], [1, 1, 3]].iter().enumerate() {
                let gate = random(shape, dtype, 10 + i as u64);
                let up = random(shape, dtype, 20 + i as u64);
                let fused = geglu(&gate, &up).expect("fused");
                let plain = ops::multiply(gelu_tanh(&gate).expect("gelu"), &up).expect("plain");
                assert!(bits_equal(&fused, &plain), "geglu {dtype:?} {shape:?}");

                let fused = softcap(&gate, 30.0).expect("fused");
                let cap = Array::from_f32(30.0).as_dtype(dtype).expect("cap");
                let plain =
                    ops::multiply(ops::tanh(ops::divide(&gate, &cap).unwrap()).unwrap(), &cap)
                        .expect("plain");
                assert!(bits_equal(&fused, &plain), "softcap {dtype:?} {shape:?}");
            }
        }
    }

    #[test]
    fn constants_are_made_once_per_value_and_dtype() {
        let made = |dtype| CONSTANTS.with(|c| c.borrow().keys().filter(|k| k.1 == dtype).count());
        let before = made(Dtype::Float16);
        let a = constant(0.25, Dtype::Float16).expect("constant");
        let b = constant(0.25, Dtype::Float16).expect("constant");
        assert_eq!(made(Dtype::Float16), before + 1, "made once");
        assert!(bits_equal(&a, &b));
        let c = constant(0.25, Dtype::Float32).expect("constant");
        assert_eq!(c.as_slice::<f32>(), [0.25]);
    }

    #[test]
    fn gelu_matches_its_formula() {
        let x = Array::from_slice(&[-3.0f32, -0.5, 0.0, 0.5, 3.0], &[5]);
        let y = gelu_tanh(&x).expect("gelu");
        for (x, y) in [-3.0f64, -0.5, 0.0, 0.5, 3.0]
            .iter()
            .zip(y.as_slice::<f32>())
        {
            let expected = 0.5
                * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
            assert!(
                (expected - *y as f64).abs() < 1e-6,
                "gelu({x}) = {y}, expected {expected}"
            );
        }
    }
}
