//! A validated [`Checkpoint`] of any layout, its tensors handed to the model
//! ([`super::assemble`]) as arrays over the mapped files.
//!
//! What each weight is held as ([`held_dtype`]) is decided here and only here, so the memory
//! plan ([`super::memory`]) and the load agree:
//! - dense float weights (HF tensors, the NVFP4 layout's dense part, modules the affine config
//!   leaves dense, dense experts) in the activation dtype: with bfloat16 activations a bf16
//!   checkpoint is used as stored, without a copy; float32 activations widen them;
//! - packed codes and NVFP4 block scales as stored (they reach MLX's quantized kernels as is);
//! - affine scales and biases as stored, widened to float32 for float32 activations (MLX's
//!   quantized kernels compute `scale · q + bias` in the promoted dtype; widening is exact);
//! - the NVFP4 per-expert global scale in float32.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};

use super::arrays::{array, release_pages};
pub use super::layout::TensorKind;
use super::layout::{Checkpoint, ModuleRef, QuantMode, Quantized, QuantizedPart};
use super::LoadError;
use crate::model::linear::Affine;
use crate::model::{Experts, Linear};

/// The dtype a tensor stored as `stored` is held in for `activation` activations.
pub fn held_dtype(kind: TensorKind, stored: Dtype, activation: Dtype) -> Dtype {
    match kind {
        TensorKind::Dense => activation,
        TensorKind::Packed => stored,
        TensorKind::AffineScale if activation == Dtype::Float32 => Dtype::Float32,
        TensorKind::AffineScale => stored,
        TensorKind::GlobalScale => Dtype::Float32,
    }
}

/// The MLX arrays of one module, as the loader hands them to the model.
#[derive(Debug)]
pub enum LoadedWeight {
    /// A plain tensor in its stored dtype.
    Dense(Array),
    /// Packed codes with their scales, in their stored dtypes.
    Quantized(Quantized<Array>),
}

/// A checkpoint directory of any layout, validated and mapped.
pub struct MappedLayout {
    dir: PathBuf,
    checkpoint: Checkpoint,
    modules: BTreeMap<String, ModuleRef>,
}

impl MappedLayout {
    /// Finds the layout of `dir`, validates it ([`Checkpoint::open`]) and keeps its mapping.
    pub fn open(dir: &Path) -> Result<Self, LoadError> {
        Ok(Self::new(Checkpoint::open(dir)?))
    }

    /// The layout of a checkpoint already opened and validated.
    pub fn new(checkpoint: Checkpoint) -> Self {
        let modules = checkpoint
            .module_names()
            .filter_map(|m| checkpoint.module_ref(m).map(|r| (m.to_string(), r.clone())))
            .collect();
        Self {
            dir: checkpoint.dir.clone(),
            checkpoint,
            modules,
        }
    }

    /// The validated checkpoint.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    fn module(&self, key: &str) -> Result<&ModuleRef, LoadError> {
        // Checkpoint::open derives its inventory from the same config.json, so this only fails
        // when config.json and the model's Config disagree about which modules exist.
        self.modules.get(key).ok_or_else(|| LoadError::Format {
            path: self.dir.join("config.json"),
            message: format!("module {key} is not in the checkpoint's inventory"),
        })
    }

    fn array(&self, name: &str, expected: &[i32]) -> Result<Array, LoadError> {
        let a = array(self.checkpoint.tensors(), name, expected)?;
        // MLX's CPU and CUDA backends copy external data into their own buffers when the array
        // is made (only Metal wraps page-aligned memory), so the mapped pages just read are
        // not needed again: without this, every tensor would be resident twice until the load
        // ends (measured: a peak of 2.0 × the bytes on disk). Where MLX did wrap them, dropping
        // the pages costs a re-read from the file on first use, nothing else.
        release_pages(self.checkpoint.tensors(), name);
        Ok(a)
    }

    /// The arrays of module `key` (HF tensor name without `.weight`) in their stored dtypes, with
    /// the shapes the model expects for a logical `[lead.., out, inp]` weight.
    pub fn weight(&self, key: &str, logical: &[i32]) -> Result<LoadedWeight, LoadError> {
        let (lead, inp) = match logical.split_last() {
            Some((&inp, lead)) => (lead, inp),
            None => (&[][..], 1),
        };
        let with_last = |last: i32| {
            let mut s = lead.to_vec();
            s.push(last);
            s
        };
        match self.module(key)? {
            ModuleRef::Dense { tensor } => Ok(LoadedWeight::Dense(self.array(tensor, logical)?)),
            ModuleRef::Quantized(q) => {
                let (code_cols, scale_cols) = match q.mode {
                    QuantMode::Nvfp4 => (inp / 8, inp / 16),
                    QuantMode::Affine { group_size, bits } => {
                        (inp * bits as i32 / 32, inp / group_size.max(1) as i32)
                    }
                };
                let shape = |part| match part {
                    QuantizedPart::Codes => with_last(code_cols),
                    QuantizedPart::Scales | QuantizedPart::Biases => with_last(scale_cols),
                    // One tensor scale per expert: the leading (expert) axis.
                    QuantizedPart::GlobalScale => lead[..1.min(lead.len())].to_vec(),
                };
                let arrays = q.try_map(|part, name| self.array(name, &shape(part)))?;
                Ok(LoadedWeight::Quantized(arrays))
            }
        }
    }

    /// `a` (the tensor `name`) held as [`held_dtype`] says; a conversion is evaluated once here
    /// so no forward pass repeats it.
    fn hold(
        &self,
        name: &str,
        a: Array,
        kind: TensorKind,
        activation: Dtype,
    ) -> Result<Array, LoadError> {
        let stored = a.dtype();
        let dtype = held_dtype(kind, stored, activation);
        if stored == dtype {
            return Ok(a);
        }
        let mlx = |source| LoadError::Mlx {
            name: name.to_owned(),
            source,
        };
        let held = a.as_dtype(dtype).map_err(mlx)?;
        held.eval().map_err(mlx)?;
        Ok(held)
    }

    /// The scales and biases of affine module `prefix`, held as [`held_dtype`] says.
    fn affine_scales(
        &self,
        prefix: &str,
        scales: Array,
        biases: Array,
        dtype: Dtype,
    ) -> Result<(Array, Array), LoadError> {
        let kind = TensorKind::AffineScale;
        Ok((
            self.hold(&format!("{prefix}.scales"), scales, kind, dtype)?,
            self.hold(&format!("{prefix}.biases"), biases, kind, dtype)?,
        ))
    }

    fn unexpected(&self, key: &str, what: &str) -> LoadError {
        LoadError::Format {
            path: self.dir.clone(),
            message: format!("module {key}: {what}"),
        }
    }

    /// A dense weight, held in `dtype`.
    fn dense(&self, prefix: &str, w: Array, dtype: Dtype) -> Result<Array, LoadError> {
        self.hold(self.dense_name(prefix), w, TensorKind::Dense, dtype)
    }

    /// The affine quantisation `weight` holds; `None` when it holds another (or an incomplete one).
    fn affine(
        &self,
        prefix: &str,
        weight: LoadedWeight,
        dtype: Dtype,
    ) -> Result<Option<Affine>, LoadError> {
        match weight {
            LoadedWeight::Quantized(Quantized {
                codes,
                scales,
                biases: Some(biases),
                mode: QuantMode::Affine { group_size, bits },
                ..
            }) => {
                let (scales, biases) = self.affine_scales(prefix, scales, biases, dtype)?;
                Ok(Some(Affine::new(
                    codes,
                    scales,
                    biases,
                    group_size as i32,
                    bits as i32,
                )))
            }
            _ => Ok(None),
        }
    }

    fn dense_name<'a>(&'a self, key: &'a str) -> &'a str {
        match self.modules.get(key) {
            Some(ModuleRef::Dense { tensor }) => tensor,
            _ => key,
        }
    }
}

/// How the model's builder ([`super::assemble`]) asks for each logical weight, by its Hugging
/// Face name (the layout maps it to its own names).
impl MappedLayout {
    /// A plain tensor (norm weights, scalars, router scales) in the activation dtype.
    pub fn tensor(&self, name: &str, shape: &[i32], dtype: Dtype) -> Result<Array, LoadError> {
        let key = name.strip_suffix(".weight").unwrap_or(name);
        match self.weight(key, shape)? {
            LoadedWeight::Dense(a) => self.hold(name, a, TensorKind::Dense, dtype),
            LoadedWeight::Quantized(_) => Err(self.unexpected(key, "quantised, expected dense")),
        }
    }

    /// A linear map `prefix` (HF: `prefix.weight` `[out, in]`).
    pub fn linear(
        &self,
        prefix: &str,
        out: i32,
        inp: i32,
        dtype: Dtype,
    ) -> Result<Linear, LoadError> {
        match self.weight(prefix, &[out, inp])? {
            LoadedWeight::Dense(w) => Ok(Linear::dense(self.dense(prefix, w, dtype)?)),
            quantized => match self.affine(prefix, quantized, dtype)? {
                Some(affine) => Ok(Linear::Affine(affine)),
                None => Err(self.unexpected(
                    prefix,
                    "only affine quantisation is supported for non-expert linears",
                )),
            },
        }
    }

    /// Stacked experts `prefix` (HF: `prefix` `[E, out, in]`, no `.weight`).
    pub fn experts(
        &self,
        prefix: &str,
        num: i32,
        out: i32,
        inp: i32,
        dtype: Dtype,
    ) -> Result<Experts, LoadError> {
        match self.weight(prefix, &[num, out, inp])? {
            LoadedWeight::Dense(w) => Ok(Experts::dense(self.dense(prefix, w, dtype)?)?),
            LoadedWeight::Quantized(Quantized {
                codes,
                scales,
                global_scale: Some(gs),
                mode: QuantMode::Nvfp4,
                ..
            }) => Ok(Experts::nvfp4(
                codes,
                scales,
                self.hold(
                    &format!("{prefix}.global_scale"),
                    gs,
                    TensorKind::GlobalScale,
                    dtype,
                )?,
            )?),
            quantized => match self.affine(prefix, quantized, dtype)? {
                Some(affine) => Ok(Experts::Affine(affine)),
                None => Err(self.unexpected(
                    prefix,
                    "quantised tensors incomplete (NVFP4 needs a global scale, affine biases)",
                )),
            },
        }
    }

    /// The stored dtype of the embedding (fixes the rounding of √hidden).
    pub fn embedding_dtype(&self) -> Dtype {
        // The dtype the model was stored in (fixes the rounding of √hidden): the dense
        // embedding's, or, when quantised, that of its scales (mlx_lm keeps them in the
        // weight's dtype).
        let name = match self.modules.get("model.decoder.embed_tokens") {
            Some(ModuleRef::Dense { tensor }) => Some(tensor),
            Some(ModuleRef::Quantized(Quantized {
                scales,
                mode: QuantMode::Affine { .. },
                ..
            })) => Some(scales),
            _ => None,
        };
        name.and_then(|n| self.checkpoint.tensors().file_of(n)?.info(n))
            .and_then(|i| super::arrays::mlx_dtype(i.dtype))
            .unwrap_or(Dtype::Bfloat16)
    }
}
