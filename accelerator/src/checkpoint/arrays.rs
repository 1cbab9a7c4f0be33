//! MLX arrays over the mapped bytes of a checkpoint's files (no second copy of the weights; MLX
//! keeps the mapping alive until its last array is released).

use std::ffi::c_void;
use std::sync::Arc;

use memmap2::MmapMut;
use mlx_rs::{Array, Dtype};

use super::tensors::{Dtype as FileDtype, TensorSet};
use super::LoadError;

/// The MLX dtype of a safetensors dtype, where MLX has one.
pub fn mlx_dtype(d: FileDtype) -> Option<Dtype> {
    Some(match d {
        FileDtype::F32 => Dtype::Float32,
        FileDtype::F16 => Dtype::Float16,
        FileDtype::BF16 => Dtype::Bfloat16,
        FileDtype::U8 => Dtype::Uint8,
        FileDtype::U16 => Dtype::Uint16,
        FileDtype::U32 => Dtype::Uint32,
        FileDtype::U64 => Dtype::Uint64,
        FileDtype::I8 => Dtype::Int8,
        FileDtype::I16 => Dtype::Int16,
        FileDtype::I32 => Dtype::Int32,
        FileDtype::I64 => Dtype::Int64,
        FileDtype::BOOL => Dtype::Bool,
        FileDtype::F64 | FileDtype::F8_E4M3 | FileDtype::F8_E5M2 => return None,
    })
}

/// Bytes per element of an MLX dtype.
pub fn element_size(d: Dtype) -> usize {
    match d {
        Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
        Dtype::Float16 | Dtype::Bfloat16 | Dtype::Uint16 | Dtype::Int16 => 2,
        Dtype::Float32 | Dtype::Uint32 | Dtype::Int32 => 4,
        _ => 8,
    }
}

unsafe extern "C" fn release_mapping(payload: *mut c_void) {
    // SAFETY: `payload` is the `Box<Arc<MmapMut>>` leaked in `array`, and MLX calls this exactly
    // once, when the array's buffer is released.
    drop(unsafe { Box::from_raw(payload as *mut Arc<MmapMut>) });
}

/// The tensor `name` as an MLX array in its stored dtype, checked against `expected` (the shape
/// the model derives from its own reading of config.json).
pub fn array(tensors: &TensorSet, name: &str, expected: &[i32]) -> Result<Array, LoadError> {
    let file = tensors.file_of(name).ok_or_else(|| LoadError::Format {
        path: Default::default(),
        message: format!("tensor {name} is not in the checkpoint"),
    })?;
    let info = file.info(name).ok_or_else(|| LoadError::Format {
        path: file.path().to_path_buf(),
        message: format!("tensor {name} is not in this file"),
    })?;
    let dtype = mlx_dtype(info.dtype).ok_or_else(|| LoadError::Dtype {
        name: name.to_owned(),
        file: file.path().to_path_buf(),
        dtype: info.dtype.to_string(),
        why: "MLX cannot hold",
    })?;
    let shape: Vec<i32> = info.shape.iter().map(|&d| d as i32).collect();
    if shape != expected {
        return Err(LoadError::ShapeMismatch {
            name: name.to_owned(),
            file: file.path().to_path_buf(),
            found: shape,
            expected: expected.to_vec(),
        });
    }
    let map = file.mapping();
    let bytes = &map[info.start..info.end];
    let ptr = bytes.as_ptr();
    let aligned = (ptr as usize).is_multiple_of(info.dtype.size());
    // SAFETY: `ptr` points at `bytes.len()` readable bytes of the mapping (the reader checked
    // that the range holds exactly `shape` × `dtype`), which the boxed Arc handed to MLX as
    // payload keeps alive until MLX releases the array (or, for the copying constructor, for the
    // duration of the call).
    let array = unsafe {
        if aligned && !bytes.is_empty() {
            let payload = Box::into_raw(Box::new(Arc::clone(map))) as *mut c_void;
            Array::from_ptr(mlx_sys::mlx_array_new_data_managed_payload(
                ptr as *mut c_void,
                shape.as_ptr(),
                shape.len() as i32,
                dtype as mlx_sys::mlx_dtype,
                payload,
                Some(release_mapping),
            ))
        } else {
            // Misaligned for its element type (or empty): let MLX copy it.
            Array::from_ptr(mlx_sys::mlx_array_new_data(
                ptr as *const c_void,
                shape.as_ptr(),
                shape.len() as i32,
                dtype as mlx_sys::mlx_dtype,
            ))
        }
    };
    Ok(array)
}

/// Tells the OS that the mapped pages of `name` are no longer needed: after a tensor has been
/// converted to a dtype of another width its stored bytes are never read again, and without this
/// they would stay resident next to the converted copy until the whole file is unmapped. Only
/// for a conversion that changes the element width: MLX may convert between equal widths in
/// place (donating the mapped buffer), and then these pages are the converted weight.
pub fn release_pages(tensors: &TensorSet, name: &str) {
    #[cfg(unix)]
    if let Some(file) = tensors.file_of(name) {
        if let Some(info) = file.info(name) {
            // Whole pages only (64 KiB is a multiple of every page size in use): a page shared
            // with a neighbouring tensor stays.
            let page = 1 << 16;
            let start = info.start.div_ceil(page) * page;
            let end = info.end / page * page;
            if end > start {
                // SAFETY: MADV_DONTNEED on a private file mapping drops the pages; a later read
                // maps the file's bytes again. No array refers to these bytes: the only array
                // over them was the one just converted and released, and MLX never writes into
                // a weight that the model still holds.
                let _ = unsafe {
                    file.mapping().unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
        }
    }
}
