//! The Hugging Face layout (`save_pretrained` of `DiffusionGemmaForBlockDiffusion`): BF16 (or
//! F32) tensors in `model.safetensors`, or sharded with `model.safetensors.index.json`.
//!
//! Names are those of diffusiongemma.md §1.8: decoder weights under `model.decoder.*` (shared with
//! the encoder), encoder layer scalars under `model.encoder.language_model.layers.N.layer_scalar`,
//! experts stacked and gate/up-fused without a `.weight` suffix. The vision tower
//! (`model.encoder.vision_tower.*`, `model.encoder.embed_vision.*`) is never read, and
//! `lm_head.weight` (tied) is ignored.

use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};

use super::{LoadError, SafetensorsShards, TensorSource, WeightLayout};
use crate::model::{Experts, Linear};

/// A Hugging Face checkpoint directory.
pub struct HfLayout {
    source: SafetensorsShards,
}

impl HfLayout {
    /// Opens `dir/model.safetensors.index.json` (sharded) or `dir/model.safetensors`.
    pub fn open(dir: &Path) -> Result<Self, LoadError> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(|source| LoadError::Io {
                path: index.clone(),
                source,
            })?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| LoadError::Format {
                    path: index.clone(),
                    message: e.to_string(),
                })?;
            let map = json["weight_map"]
                .as_object()
                .ok_or_else(|| LoadError::Format {
                    path: index.clone(),
                    message: "no weight_map object".into(),
                })?;
            let mut names: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else if dir.join("model.safetensors").is_file() {
            vec![dir.join("model.safetensors")]
        } else {
            return Err(LoadError::UnknownLayout {
                dir: dir.to_path_buf(),
            });
        };
        Ok(Self {
            source: SafetensorsShards::open(&files)?,
        })
    }

    /// The underlying tensors.
    pub fn source(&self) -> &SafetensorsShards {
        &self.source
    }

    fn cast(&self, name: &str, shape: &[i32], dtype: Dtype) -> Result<Array, LoadError> {
        let t = self.source.tensor(name, shape)?;
        let mlx = |source| LoadError::Mlx {
            name: name.to_owned(),
            source,
        };
        if t.dtype() == dtype {
            return Ok(t);
        }
        let t = t.as_dtype(dtype).map_err(mlx)?;
        // Materialise once at load so no forward pass repeats the conversion.
        t.eval().map_err(mlx)?;
        Ok(t)
    }
}

impl WeightLayout for HfLayout {
    fn tensor(&self, name: &str, shape: &[i32], dtype: Dtype) -> Result<Array, LoadError> {
        self.cast(name, shape, dtype)
    }

    fn linear(&self, prefix: &str, out: i32, inp: i32, dtype: Dtype) -> Result<Linear, LoadError> {
        Ok(Linear::dense(self.cast(
            &format!("{prefix}.weight"),
            &[out, inp],
            dtype,
        )?))
    }

    fn experts(
        &self,
        prefix: &str,
        num: i32,
        out: i32,
        inp: i32,
        _dtype: Dtype,
    ) -> Result<Experts, LoadError> {
        // Dense experts run in float32 whatever the activation dtype (CPU gather_mm).
        let w = self.cast(prefix, &[num, out, inp], Dtype::Float32)?;
        Ok(Experts::dense(w)?)
    }

    fn embedding_dtype(&self) -> Dtype {
        self.source
            .dtype_of("model.decoder.embed_tokens.weight")
            .unwrap_or(Dtype::Bfloat16)
    }
}
