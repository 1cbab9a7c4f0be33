//! A Hugging Face folder of a chat model: `config.json` and safetensors (bf16, f16 or f32, or
//! mlx-community's affine layout: `uint32` codes beside `.scales` and `.biases`). Bits and group
//! size are read from each tensor's shapes, not from the config's `quantization` block, so
//! per-module overrides and converters that omit the block load the same.

use std::path::{Path, PathBuf};

use mlx_rs::Array;

use super::{float32, norm_weight, CausalLoadError, CausalWeights};
use crate::checkpoint::arrays::array;
use crate::checkpoint::files::weight_files;
use crate::checkpoint::tensors::{Dtype as FileDtype, TensorSet};
use crate::checkpoint::LoadError;
use crate::model::causal::config::{HfObject, SERVED_MODEL_TYPES};
use crate::model::causal::{
    gemma3, keys, llama, qwen2, qwen3, Architecture, CausalConfig, ConfigError,
};
use crate::model::linear::Linear;

/// The family's config from a whole `config.json`: the text model's object read by its family's
/// reader (every key accounted for), and a multimodal Gemma 3's top level checked for keys
/// other than its vision tower's.
pub fn config_from_json(
    json: &serde_json::Value,
    ignored: &[String],
) -> Result<CausalConfig, ConfigError> {
    let top = json.as_object().ok_or_else(|| ConfigError::Invalid {
        key: "config.json".into(),
        value: keys::shown(json),
        why: "is not an object".into(),
    })?;
    let nested = top.get("text_config").and_then(|t| t.as_object());
    let (map, prefix) = match nested {
        Some(text) => (text, "text_config."),
        None => (top, ""),
    };
    let model_type = map
        .get("model_type")
        .and_then(|v| v.as_str())
        .ok_or_else(|| ConfigError::Missing {
            key: format!("{prefix}model_type"),
            why: "the family cannot be told without it".into(),
        })?;
    let architecture =
        Architecture::from_model_type(model_type).ok_or_else(|| ConfigError::UnknownFamily {
            field: "model_type",
            value: model_type.to_owned(),
            served: SERVED_MODEL_TYPES,
        })?;
    let mut top_ignored = Vec::new();
    if nested.is_some() {
        let outer = top
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        if architecture != Architecture::Gemma3 || outer != "gemma3" {
            return Err(ConfigError::UnknownFamily {
                field: "model_type (with a text_config)",
                value: outer.to_owned(),
                served: "gemma3 (multimodal Gemma 3, read as text)",
            });
        }
        top_ignored = keys::audit(
            top,
            "gemma3",
            "",
            gemma3::MULTIMODAL_KEYS,
            keys::HF_HARMLESS,
            ignored,
        )?;
    }
    let hf = HfObject { map, prefix };
    let mut config = match architecture {
        Architecture::Llama => llama::config_from_hf(&hf, model_type, ignored),
        Architecture::Qwen2 => qwen2::config_from_hf(&hf, ignored),
        Architecture::Qwen3 => qwen3::config_from_hf(&hf, ignored),
        Architecture::Gemma3 => gemma3::config_from_hf(&hf, ignored),
    }?;
    // A multimodal config keeps `tie_word_embeddings` at its top level.
    if nested.is_some() {
        if let Some(tied) = top.get("tie_word_embeddings").and_then(|v| v.as_bool()) {
            config.tie_word_embeddings = tied;
        }
    }
    config.ignored_config_keys.extend(top_ignored);
    Ok(config)
}

/// The text model's part of a config: `text_config` for a multimodal Gemma 3, else the top.
pub(super) fn text_config(json: &serde_json::Value) -> &serde_json::Value {
    match json.get("text_config") {
        Some(text) if text.is_object() => text,
        _ => json,
    }
}

/// Where converters put the text model's `model.` modules: at the top, or nested in a
/// multimodal Gemma 3 (older transformers: `language_model.model.`, newer: `model.language_model.`).
const TEXT_ROOTS: [&str; 3] = ["model.", "language_model.model.", "model.language_model."];

pub(super) struct HfWeights {
    dir: PathBuf,
    config: CausalConfig,
    tensors: TensorSet,
    /// What `model.` stands for in this checkpoint (see [`TEXT_ROOTS`]).
    root: String,
}

impl HfWeights {
    /// The folder `dir`, its `config.json` read once by its family's reader, `ignored` the
    /// config keys the user said to skip.
    pub fn open(dir: &Path, ignored: &[String]) -> Result<HfWeights, CausalLoadError> {
        let config_path = dir.join("config.json");
        let bad = |why: String| CausalLoadError::Config {
            path: config_path.clone(),
            why,
        };
        let text = std::fs::read_to_string(&config_path).map_err(|source| CausalLoadError::Io {
            path: config_path.clone(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let config = config_from_json(&json, ignored).map_err(|e| bad(e.to_string()))?;
        let files = weight_files(dir).map_err(|e| bad(e.to_string()))?;
        let tensors = TensorSet::open(&files.files).map_err(|e| CausalLoadError::Config {
            path: dir.to_path_buf(),
            why: e.to_string(),
        })?;
        let root = TEXT_ROOTS
            .iter()
            .find(|root| tensors.contains(&format!("{root}embed_tokens.weight")))
            .ok_or_else(|| CausalLoadError::Tensor {
                path: dir.to_path_buf(),
                name: "model.embed_tokens.weight".into(),
                why: "not in the checkpoint (nor under language_model.)".into(),
            })?
            .to_string();
        Ok(HfWeights {
            dir: dir.to_path_buf(),
            config,
            tensors,
            root,
        })
    }

    fn name(&self, module: &str, part: &str) -> String {
        match module.strip_prefix("model.") {
            Some(rest) => format!("{}{rest}.{part}", self.root),
            // The head sits beside the text model: `language_model.lm_head` when the text model
            // is `language_model.model`, the top-level `lm_head` otherwise.
            None if self.root == "language_model.model." => {
                format!("language_model.{module}.{part}")
            }
            None => format!("{module}.{part}"),
        }
    }

    fn tensor_error(&self, name: &str, why: String) -> CausalLoadError {
        CausalLoadError::Tensor {
            path: self.dir.clone(),
            name: name.to_owned(),
            why,
        }
    }

    fn shape(&self, name: &str) -> Result<(FileDtype, Vec<i32>), CausalLoadError> {
        let file = self
            .tensors
            .file_of(name)
            .ok_or_else(|| self.tensor_error(name, "not in the checkpoint".into()))?;
        let info = file
            .info(name)
            .ok_or_else(|| self.tensor_error(name, "not in its file".into()))?;
        Ok((info.dtype, info.shape.iter().map(|&d| d as i32).collect()))
    }

    /// Bytes the tensors hold (they are mapped as stored).
    pub fn loaded_bytes(&self) -> u64 {
        self.tensors.data_bytes()
    }
}

impl CausalWeights for HfWeights {
    fn config(&self) -> &CausalConfig {
        &self.config
    }

    fn contains(&self, module: &str) -> bool {
        self.tensors.contains(&self.name(module, "weight"))
    }

    fn linear(&self, module: &str, out: i32, input: i32) -> Result<Linear, CausalLoadError> {
        let name = self.name(module, "weight");
        let (dtype, shape) = self.shape(&name)?;
        if dtype != FileDtype::U32 {
            return Ok(Linear::dense(array(&self.tensors, &name, &[out, input])?));
        }
        // Affine: codes `[out, in·bits/32]`, scales and biases `[out, in/group]`.
        let scales_name = self.name(module, "scales");
        let biases_name = self.name(module, "biases");
        let (_, scales_shape) = self.shape(&scales_name)?;
        let packed = shape.get(1).copied().unwrap_or(0);
        let groups = scales_shape.get(1).copied().unwrap_or(0);
        let bits = packed * 32 / input.max(1);
        if shape.first() != Some(&out)
            || packed * 32 != bits * input
            || !matches!(bits, 2 | 3 | 4 | 5 | 6 | 8)
            || groups <= 0
            || input % groups != 0
        {
            return Err(self.tensor_error(
                &name,
                format!(
                    "uint32 codes of shape {shape:?} with scales {scales_shape:?} are not an \
                     affine quantisation of a [{out}, {input}] weight"
                ),
            ));
        }
        let group_size = input / groups;
        let weight = array(&self.tensors, &name, &[out, packed])?;
        let scales = array(&self.tensors, &scales_name, &[out, groups])?;
        let biases = array(&self.tensors, &biases_name, &[out, groups])?;
        Ok(Linear::affine(weight, scales, biases, group_size, bits))
    }

    fn bias(&self, module: &str, len: i32) -> Result<Option<Array>, CausalLoadError> {
        let name = self.name(module, "bias");
        if !self.tensors.contains(&name) {
            return Ok(None);
        }
        let stored = array(&self.tensors, &name, &[len])?;
        Ok(Some(float32(stored)?))
    }

    fn norm(&self, module: &str, len: i32) -> Result<Array, CausalLoadError> {
        let name = self.name(module, "weight");
        let stored = array(&self.tensors, &name, &[len]).map_err(|e| match e {
            LoadError::ShapeMismatch { .. } => {
                self.tensor_error(&name, format!("{e}; a norm over {len} values was expected"))
            }
            other => other.into(),
        })?;
        norm_weight(stored, self.config.norm_offset())
    }
}
