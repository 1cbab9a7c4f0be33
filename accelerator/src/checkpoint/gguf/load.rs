//! A GGUF tensor as MLX arrays: float tensors over the mapped bytes as they are, Q4_0, Q4_1
//! and Q8_0 repacked into MLX's affine layout, the other supported types dequantised.

use std::ffi::c_void;
use std::sync::Arc;

use half::{bf16, f16};
use memmap2::MmapMut;
use mlx_rs::{Array, Dtype};

use super::blocks::{self, AffineParts};
use super::error::GgufError;
use super::file::{GgufFile, GgufTensorInfo};
use super::float::Float;
use super::kquants;
use super::types::{FloatDtype, GgmlType};

/// Elements per group of the affine layouts made here (one ggml block).
pub const GROUP_SIZE: i32 = 32;

/// A loaded tensor, row-major (the file's dims reversed).
#[derive(Debug)]
pub enum GgufWeight {
    /// F32, F16 and BF16 as stored (over the mapping); dequantised types in the requested
    /// [`FloatDtype`].
    Dense(Array),
    /// MLX affine quantisation of a `[..., rows, cols]` tensor, as `mlx.core.quantize` makes
    /// it: `weight` uint32 `[..., rows, cols · bits / 32]`, `scales` and `biases`
    /// `[..., rows, cols / group_size]` in the requested [`FloatDtype`].
    Affine {
        weight: Array,
        scales: Array,
        biases: Array,
        bits: i32,
        group_size: i32,
    },
}

impl GgufFile {
    /// Bytes the tensor takes once loaded: stored float tensors as they are, affine ones as
    /// packed codes plus scales and biases, dequantised ones in `float`. An unsupported type
    /// counts as its stored size (its load is refused anyway).
    pub fn resident_bytes(&self, info: &GgufTensorInfo, float: FloatDtype) -> u64 {
        let elements = info.elements();
        if let Some(bits) = info.ggml_type.affine_bits() {
            let groups = elements / GROUP_SIZE as u64;
            elements * bits as u64 / 8 + 2 * groups * float.size()
        } else if info.ggml_type.is_dequantised() {
            elements * float.size()
        } else {
            info.stored_bytes().unwrap_or(0)
        }
    }

    /// The tensor `name` as MLX arrays (see [`GgufWeight`]); `float` is the dtype of what the
    /// load computes (dequantised values, affine scales and biases).
    pub fn load(&self, name: &str, float: FloatDtype) -> Result<GgufWeight, GgufError> {
        let info = self.tensor(name).ok_or_else(|| GgufError::Missing {
            path: self.path.clone(),
            name: name.to_owned(),
        })?;
        let ggml_type = info.ggml_type;
        if !ggml_type.is_supported() {
            return Err(GgufError::Unsupported {
                path: self.path.clone(),
                name: name.to_owned(),
                ggml_type,
            });
        }
        let shape = info.shape();
        let bytes = self.bytes_of(info);
        if let Some(dtype) = dense_dtype(ggml_type) {
            return Ok(GgufWeight::Dense(self.mapped(info, &shape, dtype)));
        }
        let unexpected = || self.tensor_error(info, "no loader for this type".into());
        if let Some(bits) = ggml_type.affine_bits() {
            let (last, outer) = shape.split_last().ok_or_else(unexpected)?;
            let with_last = |n: i32| [outer, &[n]].concat();
            let codes = with_last(last * bits / 32);
            let groups = with_last(last / GROUP_SIZE);
            let (weight, scales, biases) = match float {
                FloatDtype::F32 => affine_arrays::<f32>(ggml_type, bytes, &codes, &groups),
                FloatDtype::F16 => affine_arrays::<f16>(ggml_type, bytes, &codes, &groups),
                FloatDtype::BF16 => affine_arrays::<bf16>(ggml_type, bytes, &codes, &groups),
            }
            .ok_or_else(unexpected)?;
            return Ok(GgufWeight::Affine {
                weight,
                scales,
                biases,
                bits,
                group_size: GROUP_SIZE,
            });
        }
        let array = match float {
            FloatDtype::F32 => dense_array::<f32>(ggml_type, bytes, &shape),
            FloatDtype::F16 => dense_array::<f16>(ggml_type, bytes, &shape),
            FloatDtype::BF16 => dense_array::<bf16>(ggml_type, bytes, &shape),
        };
        array.map(GgufWeight::Dense).ok_or_else(unexpected)
    }

    /// The tensor `name` as one evaluated float32 array, whatever it is stored as: float
    /// tensors widened, quantised ones dequantised as their load makes them (for the small
    /// tensors a model reads as values: norms, biases, a head's vectors).
    pub fn load_float32(&self, name: &str) -> Result<Array, GgufError> {
        let info = self.tensor(name).ok_or_else(|| GgufError::Missing {
            path: self.path.clone(),
            name: name.to_owned(),
        })?;
        let mlx = |e: mlx_rs::error::Exception| {
            self.tensor_error(info, format!("reading it as float32: {e}"))
        };
        let array = match self.load(name, FloatDtype::F32)? {
            GgufWeight::Dense(array) => array,
            GgufWeight::Affine {
                weight,
                scales,
                biases,
                bits,
                group_size,
            } => {
                mlx_rs::ops::dequantize(&weight, &scales, &biases, group_size, bits).map_err(mlx)?
            }
        };
        let array = array.as_dtype(Dtype::Float32).map_err(mlx)?;
        array.eval().map_err(mlx)?;
        Ok(array)
    }

    /// An array over the tensor's mapped bytes (no copy), or a copy of them where they are not
    /// aligned for the element type (a file written with `general.alignment` below 4).
    fn mapped(&self, info: &GgufTensorInfo, shape: &[i32], dtype: Dtype) -> Array {
        let bytes = self.bytes_of(info);
        let ptr = bytes.as_ptr();
        let width = if dtype == Dtype::Float32 { 4 } else { 2 };
        let aligned = (ptr as usize).is_multiple_of(width);
        // SAFETY: `ptr` points at `bytes.len()` readable bytes of the mapping, which `open`
        // checked hold exactly `shape` elements of `dtype`; the boxed Arc handed to MLX as
        // payload keeps the mapping alive until MLX releases the array (the copying
        // constructor reads the bytes only during the call).
        unsafe {
            if aligned && !bytes.is_empty() {
                let payload = Box::into_raw(Box::new(Arc::clone(&self.map))) as *mut c_void;
                Array::from_ptr(mlx_sys::mlx_array_new_data_managed_payload(
                    ptr as *mut c_void,
                    shape.as_ptr(),
                    shape.len() as i32,
                    dtype as mlx_sys::mlx_dtype,
                    payload,
                    Some(release::<Arc<MmapMut>>),
                ))
            } else {
                Array::from_ptr(mlx_sys::mlx_array_new_data(
                    ptr as *const c_void,
                    shape.as_ptr(),
                    shape.len() as i32,
                    dtype as mlx_sys::mlx_dtype,
                ))
            }
        }
    }
}

fn dense_dtype(t: GgmlType) -> Option<Dtype> {
    match t {
        GgmlType::F32 => Some(Dtype::Float32),
        GgmlType::F16 => Some(Dtype::Float16),
        GgmlType::BF16 => Some(Dtype::Bfloat16),
        _ => None,
    }
}

fn affine_arrays<T: Float + Owned>(
    t: GgmlType,
    bytes: &[u8],
    codes_shape: &[i32],
    groups_shape: &[i32],
) -> Option<(Array, Array, Array)> {
    let AffineParts {
        codes,
        scales,
        biases,
    } = blocks::affine::<T>(t, bytes)?;
    Some((
        owned(codes, codes_shape),
        owned(scales, groups_shape),
        owned(biases, groups_shape),
    ))
}

fn dense_array<T: Float + Owned>(t: GgmlType, bytes: &[u8], shape: &[i32]) -> Option<Array> {
    Some(owned(kquants::dequantise::<T>(t, bytes)?, shape))
}

/// Element types an owned buffer is handed to MLX in.
trait Owned: Copy + 'static {
    const DTYPE: Dtype;
}

impl Owned for u32 {
    const DTYPE: Dtype = Dtype::Uint32;
}
impl Owned for f32 {
    const DTYPE: Dtype = Dtype::Float32;
}
impl Owned for f16 {
    const DTYPE: Dtype = Dtype::Float16;
}
impl Owned for bf16 {
    const DTYPE: Dtype = Dtype::Bfloat16;
}

unsafe extern "C" fn release<P>(payload: *mut c_void) {
    // SAFETY: `payload` is the `Box<P>` leaked where the array was made, and MLX calls this
    // exactly once, when the array's buffer is released.
    drop(unsafe { Box::from_raw(payload as *mut P) });
}

/// An array that takes ownership of `data` (no copy: a repacked or dequantised tensor never
/// exists twice). `data` holds exactly the elements of `shape` (the callers derive both from
/// the same tensor info).
fn owned<T: Owned>(data: Vec<T>, shape: &[i32]) -> Array {
    if data.is_empty() {
        // MLX wants a buffer to own; an empty tensor has none.
        // SAFETY: a zero-element array reads nothing from the pointer.
        return unsafe {
            Array::from_ptr(mlx_sys::mlx_array_new_data(
                std::ptr::NonNull::<T>::dangling().as_ptr() as *const c_void,
                shape.as_ptr(),
                shape.len() as i32,
                T::DTYPE as mlx_sys::mlx_dtype,
            ))
        };
    }
    let mut boxed = Box::new(data);
    let ptr = boxed.as_mut_ptr() as *mut c_void;
    // SAFETY: `ptr` points at the vector's elements, which live on the heap until the box,
    // handed to MLX as payload, is dropped by `release` when MLX frees the array; moving the
    // box does not move the elements.
    unsafe {
        let payload = Box::into_raw(boxed) as *mut c_void;
        Array::from_ptr(mlx_sys::mlx_array_new_data_managed_payload(
            ptr,
            shape.as_ptr(),
            shape.len() as i32,
            T::DTYPE as mlx_sys::mlx_dtype,
            payload,
            Some(release::<Vec<T>>),
        ))
    }
}
