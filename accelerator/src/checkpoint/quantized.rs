//! The two quantised layouts as a [`WeightLayout`]: super-decider's NVFP4 experts
//! (`manifest.json`) and mlx-community's MLX affine layout (`quantization` in config.json).
//!
//! [`Checkpoint::open`] validates every tensor's name, dtype and shape against config.json and
//! says which modules are quantised and how; the arrays themselves are then built over the same
//! files through [`SafetensorsShards`], whose private mapping MLX keeps alive (no copy of the
//! codes, and the validator's own read-only mapping is dropped once validation is done, so the
//! weights are mapped once). Packed codes and scales reach MLX's quantized kernels as stored:
//! nothing is dequantised or re-quantised at load.
//!
//! - NVFP4 experts → [`Experts::nvfp4`] (`gather_qmm` mode "nvfp4", see its notes on the global
//!   scale); every other tensor is dense bf16 and loads like HF.
//! - Affine linears (embedding, attention, dense MLPs, router) → [`Linear::affine`]
//!   (`quantized_matmul`; the embedding lookup dequantises only the gathered rows, the tied
//!   unembedding multiplies with the same codes); affine experts → [`Experts::affine`]
//!   (`gather_qmm`). Modules the config marks `false` (input width not a multiple of 64) load
//!   dense.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};

use super::layout::{Checkpoint, LayoutError, ModuleRef, QuantMode};
use super::writer::Layout;
use super::{LoadError, SafetensorsShards, TensorSource, WeightLayout};
use crate::model::{Experts, Linear};

/// The MLX arrays of one module, as the loader hands them to the model.
#[derive(Debug)]
pub enum LoadedWeight {
    /// A plain tensor in its stored dtype.
    Dense(Array),
    /// Packed codes with their scales, in their stored dtypes.
    Quantized {
        /// uint32 packed codes.
        codes: Array,
        /// NVFP4: uint8 E4M3; affine: float.
        scales: Array,
        /// Affine only.
        biases: Option<Array>,
        /// NVFP4 only: float32 `[E]`.
        global_scale: Option<Array>,
        /// Encoding.
        mode: QuantMode,
    },
}

/// An NVFP4 or affine checkpoint directory, validated and mapped.
pub struct QuantizedLayout {
    dir: PathBuf,
    layout: Layout,
    modules: BTreeMap<String, ModuleRef>,
    source: SafetensorsShards,
}

impl QuantizedLayout {
    /// Validates `dir` (any layout [`Checkpoint::open`] accepts) and maps its weight files.
    pub fn open(dir: &Path) -> Result<Self, LoadError> {
        let checkpoint = Checkpoint::open(dir)?;
        let files: Vec<PathBuf> = checkpoint
            .tensors()
            .files()
            .iter()
            .map(|f| f.path().to_path_buf())
            .collect();
        let modules = checkpoint
            .module_names()
            .filter_map(|m| checkpoint.module_ref(m).map(|r| (m.to_string(), r.clone())))
            .collect();
        let layout = checkpoint.layout;
        // Unmap the validator's view before mapping for MLX (one mapping of the weights).
        drop(checkpoint);
        Ok(Self {
            dir: dir.to_path_buf(),
            layout,
            modules,
            source: SafetensorsShards::open(&files)?,
        })
    }

    /// Which layout the directory holds.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The underlying tensors.
    pub fn source(&self) -> &SafetensorsShards {
        &self.source
    }

    fn module(&self, key: &str) -> Result<&ModuleRef, LoadError> {
        // Checkpoint::open derives its inventory from the same config.json, so this only fails
        // when config.json and the model's Config disagree about which modules exist.
        self.modules.get(key).ok_or_else(|| LoadError::Format {
            path: self.dir.join("config.json"),
            message: format!("module {key} is not in the checkpoint's inventory"),
        })
    }

    /// The arrays of module `key` (HF tensor name without `.weight`) with the shapes the model
    /// expects for a logical `[lead.., out, inp]` weight; for tests and tools.
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
            ModuleRef::Dense { tensor } => {
                Ok(LoadedWeight::Dense(self.source.tensor(tensor, logical)?))
            }
            ModuleRef::Quantized {
                codes,
                scales,
                biases,
                global_scale,
                mode,
            } => {
                let (code_cols, scale_cols) = match *mode {
                    QuantMode::Nvfp4 => (inp / 8, inp / 16),
                    QuantMode::Affine { group_size, bits } => {
                        (inp * bits as i32 / 32, inp / group_size as i32)
                    }
                };
                let codes = self.source.tensor(codes, &with_last(code_cols))?;
                let scales = self.source.tensor(scales, &with_last(scale_cols))?;
                let biases = match biases {
                    Some(b) => Some(self.source.tensor(b, &with_last(scale_cols))?),
                    None => None,
                };
                let global_scale = match global_scale {
                    // One tensor scale per expert: the leading (expert) axis.
                    Some(g) => Some(self.source.tensor(g, &lead[..1.min(lead.len())])?),
                    None => None,
                };
                Ok(LoadedWeight::Quantized {
                    codes,
                    scales,
                    biases,
                    global_scale,
                    mode: *mode,
                })
            }
        }
    }

    fn unexpected(&self, key: &str, what: &str) -> LoadError {
        LoadError::Format {
            path: self.dir.clone(),
            message: format!("module {key}: {what}"),
        }
    }
}

fn cast(name: &str, a: Array, dtype: Dtype) -> Result<Array, LoadError> {
    if a.dtype() == dtype {
        return Ok(a);
    }
    let mlx = |source| LoadError::Mlx {
        name: name.to_owned(),
        source,
    };
    let a = a.as_dtype(dtype).map_err(mlx)?;
    // Materialise once at load so no forward pass repeats the conversion.
    a.eval().map_err(mlx)?;
    Ok(a)
}

/// The dtype affine scales and biases are held in. MLX's quantized kernels compute
/// `scale · q + bias` in the promoted dtype of activations and scales, so in float32 runs the
/// stored (bf16) scales are widened once here — exactly, values unchanged — instead of on every
/// call; a bf16 run keeps them as stored.
fn affine_scale_dtype(stored: Dtype, activation: Dtype) -> Dtype {
    if activation == Dtype::Float32 {
        Dtype::Float32
    } else {
        stored
    }
}

impl WeightLayout for QuantizedLayout {
    fn tensor(&self, name: &str, shape: &[i32], dtype: Dtype) -> Result<Array, LoadError> {
        let key = name.strip_suffix(".weight").unwrap_or(name);
        match self.weight(key, shape)? {
            LoadedWeight::Dense(a) => cast(name, a, dtype),
            LoadedWeight::Quantized { .. } => {
                Err(self.unexpected(key, "quantised, expected dense"))
            }
        }
    }

    fn linear(&self, prefix: &str, out: i32, inp: i32, dtype: Dtype) -> Result<Linear, LoadError> {
        match self.weight(prefix, &[out, inp])? {
            LoadedWeight::Dense(w) => Ok(Linear::dense(cast(prefix, w, dtype)?)),
            LoadedWeight::Quantized {
                codes,
                scales,
                biases: Some(biases),
                mode: QuantMode::Affine { group_size, bits },
                ..
            } => {
                let sd = affine_scale_dtype(scales.dtype(), dtype);
                Ok(Linear::affine(
                    codes,
                    cast(prefix, scales, sd)?,
                    cast(prefix, biases, sd)?,
                    group_size as i32,
                    bits as i32,
                ))
            }
            LoadedWeight::Quantized { .. } => Err(self.unexpected(
                prefix,
                "only affine quantisation is supported for non-expert linears",
            )),
        }
    }

    fn experts(
        &self,
        prefix: &str,
        num: i32,
        out: i32,
        inp: i32,
        dtype: Dtype,
    ) -> Result<Experts, LoadError> {
        match self.weight(prefix, &[num, out, inp])? {
            // Dense experts run in float32 whatever the activation dtype (CPU gather_mm).
            LoadedWeight::Dense(w) => Ok(Experts::dense(cast(prefix, w, Dtype::Float32)?)?),
            LoadedWeight::Quantized {
                codes,
                scales,
                global_scale: Some(gs),
                mode: QuantMode::Nvfp4,
                ..
            } => Ok(Experts::nvfp4(codes, scales, gs)?),
            LoadedWeight::Quantized {
                codes,
                scales,
                biases: Some(biases),
                mode: QuantMode::Affine { group_size, bits },
                ..
            } => {
                let sd = affine_scale_dtype(scales.dtype(), dtype);
                Ok(Experts::affine(
                    codes,
                    cast(prefix, scales, sd)?,
                    cast(prefix, biases, sd)?,
                    group_size as i32,
                    bits as i32,
                ))
            }
            LoadedWeight::Quantized { .. } => Err(self.unexpected(
                prefix,
                "quantised tensors incomplete (NVFP4 needs a global scale, affine biases)",
            )),
        }
    }

    fn embedding_dtype(&self) -> Dtype {
        // The dtype the model was stored in (fixes the rounding of √hidden): the dense
        // embedding's, or, when quantised, that of its scales (mlx_lm keeps them in the
        // weight's dtype).
        let key = "model.decoder.embed_tokens";
        let stored = match self.modules.get(key) {
            Some(ModuleRef::Dense { tensor }) => self.source.dtype_of(tensor),
            Some(ModuleRef::Quantized { scales, mode, .. }) => match mode {
                QuantMode::Affine { .. } => self.source.dtype_of(scales),
                QuantMode::Nvfp4 => None,
            },
            None => None,
        };
        stored.unwrap_or(Dtype::Bfloat16)
    }
}

impl From<LayoutError> for LoadError {
    fn from(e: LayoutError) -> Self {
        LoadError::Layout(Box::new(e))
    }
}
