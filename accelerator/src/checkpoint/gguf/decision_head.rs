//! A kev decision model's pointer head as llama.cpp's converter writes it: `cls.output.weight`
//! (`[2p, n_embd]` row-major: the query's `p` rows, then the key's) and `cls.output.bias`
//! (`[2p]`), read as float32 values whatever type they are stored as. What they mean is the
//! read's (`read::decision`'s kev); this module only reads them.

use super::{GgufError, GgufFile};

/// The head's projection.
pub const POINTER_HEAD_WEIGHT: &str = "cls.output.weight";
/// The head's bias.
pub const POINTER_HEAD_BIAS: &str = "cls.output.bias";

/// One tensor of the head: its name, values and row-major shape.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadTensor {
    pub name: &'static str,
    pub values: Vec<f32>,
    pub shape: Vec<usize>,
}

/// The head's weight and bias; a missing one is refused by name.
pub fn pointer_head_tensors(file: &GgufFile) -> Result<(HeadTensor, HeadTensor), GgufError> {
    Ok((
        float32_values(file, POINTER_HEAD_WEIGHT)?,
        float32_values(file, POINTER_HEAD_BIAS)?,
    ))
}

/// The tensor `name` as float32 values: float tensors widened, quantised ones dequantised as
/// their load makes them.
fn float32_values(file: &GgufFile, name: &'static str) -> Result<HeadTensor, GgufError> {
    let info = file.tensor(name).ok_or_else(|| GgufError::Missing {
        path: file.path().to_path_buf(),
        name: name.to_owned(),
    })?;
    let shape = info.shape().iter().map(|&d| d as usize).collect();
    let bad = |why: String| file.tensor_error(info, why);
    let values = file
        .load_float32(name)?
        .try_as_slice::<f32>()
        .map_err(|_| bad("not contiguous once read as float32".into()))?
        .to_vec();
    Ok(HeadTensor {
        name,
        values,
        shape,
    })
}
