//! A chat model in one GGUF file: the configuration from `{arch}.*` metadata, the weights by
//! llama.cpp's names (`token_embd`, `blk.N.attn_q`, …).
//!
//! Two conventions of llama.cpp's converter are undone here. Llama-architecture files have the
//! rows of `attn_q` and `attn_k` permuted per head so that rotary pairs sit side by side (its
//! interleaved rope); they are put back in Hugging Face's order, which the model's rotate-half
//! RoPE expects (Qwen3 and Gemma 3 files keep that order). Gemma norms are stored with the one of
//! `1 + w` already added, so they are used as stored.

use std::sync::Arc;

use mlx_rs::Array;

use super::{norm_weight, CausalLoadError, CausalWeights};
use crate::checkpoint::gguf::{self, FloatDtype, GgmlType, GgufFile, GgufWeight};
use crate::model::causal::{Architecture, CausalConfig};
use crate::model::linear::Linear;
use crate::model::ModelError;

pub(super) struct GgufWeights {
    file: GgufFile,
    config: CausalConfig,
    /// Whether matrices of the block types the integer products take are packed for them at
    /// load ([`Linear::Packed`]) instead of loaded as MLX arrays: where the model will run on
    /// the native path with the integer products.
    pack: bool,
}

impl GgufWeights {
    /// `file`'s weights under its configuration, `ignored` the metadata keys the user said are
    /// harmless.
    pub fn new(file: GgufFile, ignored: &[String]) -> Result<GgufWeights, CausalLoadError> {
        let config = super::gguf_config::config_from_metadata(&file, ignored)?;
        Ok(GgufWeights {
            file,
            config,
            pack: false,
        })
    }

    /// Packs the matrices the integer products take at load from now on (when `pack`).
    pub fn pack_for_native(&mut self, pack: bool) {
        self.pack = pack;
    }

    /// Whether the tensor is a matrix loaded packed.
    fn packed(&self, t: GgmlType, dims: usize) -> bool {
        self.pack && dims == 2 && gguf::packs(t)
    }

    /// Bytes the tensors take once loaded.
    pub fn loaded_bytes(&self) -> u64 {
        self.file
            .tensors()
            .map(|info| {
                let float = || {
                    self.file
                        .resident_bytes(info, float_for(info.ggml_type.affine_bits()))
                };
                if !self.packed(info.ggml_type, info.dims.len()) {
                    float()
                } else if gathered(&info.name) {
                    // Left in the mapping: at most its stored bytes are ever resident.
                    info.stored_bytes().unwrap_or(0)
                } else {
                    let (rows, cols) = (info.dims[1], info.dims[0]);
                    gguf::packed_bytes(info.ggml_type, rows, cols).unwrap_or_else(float)
                }
            })
            .sum()
    }

    /// llama.cpp's name of a Hugging Face module.
    fn gguf_name(&self, module: &str) -> Option<String> {
        let gemma = self.config.architecture == Architecture::Gemma3;
        let name = match module {
            "model.embed_tokens" => "token_embd".to_owned(),
            "model.norm" => "output_norm".to_owned(),
            "lm_head" => "output".to_owned(),
            _ => {
                let rest = module.strip_prefix("model.layers.")?;
                let (index, sub) = rest.split_once('.')?;
                let part = match sub {
                    "self_attn.q_proj.bias" => return Some(format!("blk.{index}.attn_q.bias")),
                    "self_attn.k_proj.bias" => return Some(format!("blk.{index}.attn_k.bias")),
                    "self_attn.v_proj.bias" => return Some(format!("blk.{index}.attn_v.bias")),
                    "self_attn.o_proj.bias" => {
                        return Some(format!("blk.{index}.attn_output.bias"))
                    }
                    "self_attn.q_proj" => "attn_q",
                    "self_attn.k_proj" => "attn_k",
                    "self_attn.v_proj" => "attn_v",
                    "self_attn.o_proj" => "attn_output",
                    "self_attn.q_norm" => "attn_q_norm",
                    "self_attn.k_norm" => "attn_k_norm",
                    "mlp.gate_proj" => "ffn_gate",
                    "mlp.up_proj" => "ffn_up",
                    "mlp.down_proj" => "ffn_down",
                    "input_layernorm" => "attn_norm",
                    "post_attention_layernorm" if gemma => "post_attention_norm",
                    "post_attention_layernorm" => "ffn_norm",
                    "pre_feedforward_layernorm" => "ffn_norm",
                    "post_feedforward_layernorm" => "post_ffw_norm",
                    _ => return None,
                };
                format!("blk.{index}.{part}")
            }
        };
        Some(format!("{name}.weight"))
    }

    fn name_of(&self, module: &str) -> Result<String, CausalLoadError> {
        self.gguf_name(module)
            .ok_or_else(|| CausalLoadError::Tensor {
                path: self.file.path().to_path_buf(),
                name: module.to_owned(),
                why: "has no GGUF counterpart".into(),
            })
    }

    fn tensor_error(&self, name: &str, why: String) -> CausalLoadError {
        CausalLoadError::Tensor {
            path: self.file.path().to_path_buf(),
            name: name.to_owned(),
            why,
        }
    }

    /// The heads whose rows llama.cpp permuted in `module`, if it did.
    fn permuted_heads(&self, module: &str) -> Option<i32> {
        if self.config.architecture != Architecture::Llama {
            return None;
        }
        if module.ends_with("self_attn.q_proj") {
            Some(self.config.num_heads)
        } else if module.ends_with("self_attn.k_proj") {
            Some(self.config.num_kv_heads)
        } else {
            None
        }
    }
}

/// Whether a tensor is read a few rows at a time (the embedding, the head), so a packed model
/// keeps it in the mapping (`GgufRows`) rather than packing it.
fn gathered(name: &str) -> bool {
    matches!(name, "token_embd.weight" | "output.weight")
}

/// The float dtype a tensor's load computes in: float32 scales for the affine types (MLX's CPU
/// kernels run float32 at full speed), float16 for dequantised ones (as MLX's own GGUF loader
/// does; the products widen it on the CPU).
fn float_for(affine_bits: Option<i32>) -> FloatDtype {
    if affine_bits.is_some() {
        FloatDtype::F32
    } else {
        FloatDtype::F16
    }
}

/// Row `r` of the Hugging Face order is row `order[r]` of llama.cpp's: the converter wrote each
/// head's rows as `reshape(2, d/2).T`, so rotary pair `(j, j + d/2)` became rows `(2j, 2j + 1)`.
fn unpermute_order(heads: i32, rows: i32) -> Vec<i32> {
    let d = rows / heads.max(1);
    let half = d / 2;
    (0..rows)
        .map(|r| {
            let (h, within) = (r / d, r % d);
            let (s, j) = (within / half, within % half);
            h * d + 2 * j + s
        })
        .collect()
}

impl CausalWeights for GgufWeights {
    fn config(&self) -> &CausalConfig {
        &self.config
    }

    fn contains(&self, module: &str) -> bool {
        self.gguf_name(module)
            .is_some_and(|name| self.file.tensor(&name).is_some())
    }

    fn linear(&self, module: &str, out: i32, input: i32) -> Result<Linear, CausalLoadError> {
        let name = self.name_of(module)?;
        let info = self
            .file
            .tensor(&name)
            .ok_or_else(|| self.tensor_error(&name, "not in the file".into()))?;
        if info.shape() != [out, input] {
            return Err(self.tensor_error(
                &name,
                format!(
                    "has shape {:?} (row-major), the config implies [{out}, {input}]",
                    info.shape()
                ),
            ));
        }
        let heads = self.permuted_heads(module);
        if heads.is_some_and(|heads| out % heads != 0 || (out / heads) % 2 != 0) {
            return Err(self.tensor_error(
                &name,
                format!(
                    "{out} rows do not split into {} heads of rotary pairs",
                    heads.unwrap_or(0)
                ),
            ));
        }
        if gathered(&name) && self.packed(info.ggml_type, info.dims.len()) {
            // Read a chunk's rows and a few label rows at a time: kept in the mapping, each
            // row dequantised as gathered, so only the rows read are ever in memory.
            return Ok(Linear::rows_from(Arc::new(self.file.rows(info)?)));
        }
        if self.packed(info.ggml_type, info.dims.len()) {
            // Straight from the blocks into the integer products' packing, llama.cpp's q/k rows
            // put back as they are packed.
            let order: Option<Vec<usize>> = heads.map(|heads| {
                unpermute_order(heads, out)
                    .into_iter()
                    .map(|r| r as usize)
                    .collect()
            });
            let packed = self.file.pack(info, order.as_deref())?;
            return Ok(Linear::packed(packed));
        }
        if self.pack && info.ggml_type.is_dequantised() {
            // Q2_K, Q3_K (and the activation types Q8_1, Q8_K): no exact packing for the
            // integer products here, so dequantised as on MLX and widened to float32 for the
            // native path (docs/models.md, "GGUF types").
            tracing::warn!(
                tensor = %name,
                ggml_type = %info.ggml_type,
                "not a type the integer products take: dequantised and widened to float32 \
                 (4 bytes a weight)"
            );
        }
        let float = float_for(info.ggml_type.affine_bits());
        let mut linear = Linear::from(self.file.load(&name, float)?);
        if let Some(heads) = heads {
            let order = unpermute_order(heads, out);
            let order = Array::from_slice(&order, &[out]);
            let rows = |a: &Array| -> Result<Array, CausalLoadError> {
                Ok(a.take_axis(&order, 0).map_err(ModelError::from)?)
            };
            linear = match linear {
                Linear::Dense { weight } => Linear::dense(rows(&weight)?),
                Linear::Affine(q) => Linear::affine(
                    rows(&q.weight)?,
                    rows(&q.scales)?,
                    rows(&q.biases)?,
                    q.group_size,
                    q.bits,
                ),
                // Only made above, already in order.
                made @ (Linear::Packed(_) | Linear::Rows(_)) => made,
            };
        }
        Ok(linear)
    }

    fn bias(&self, module: &str, len: i32) -> Result<Option<Array>, CausalLoadError> {
        let Some(name) = self.gguf_name(&format!("{module}.bias")) else {
            return Ok(None);
        };
        let Some(info) = self.file.tensor(&name) else {
            return Ok(None);
        };
        if info.shape() != [len] {
            return Err(self.tensor_error(
                &name,
                format!(
                    "has shape {:?}, a bias of {len} values was expected",
                    info.shape()
                ),
            ));
        }
        let bias = match self.file.load(&name, FloatDtype::F32)? {
            GgufWeight::Dense(b) => super::float32(b)?,
            GgufWeight::Affine { .. } => {
                return Err(self.tensor_error(&name, "a bias is quantised".into()))
            }
        };
        // llama.cpp's converter permutes the q/k biases' rows with their weights'.
        match self.permuted_heads(module) {
            Some(heads) => {
                let order = unpermute_order(heads, len);
                let order = Array::from_slice(&order, &[len]);
                let rows = bias.take_axis(&order, 0).map_err(ModelError::from)?;
                Ok(Some(super::float32(rows)?))
            }
            None => Ok(Some(bias)),
        }
    }

    fn norm(&self, module: &str, len: i32) -> Result<Array, CausalLoadError> {
        let name = self.name_of(module)?;
        let info = self
            .file
            .tensor(&name)
            .ok_or_else(|| self.tensor_error(&name, "not in the file".into()))?;
        if info.shape() != [len] {
            return Err(self.tensor_error(
                &name,
                format!(
                    "has shape {:?}, a norm over {len} values was expected",
                    info.shape()
                ),
            ));
        }
        let stored = match self.file.load(&name, FloatDtype::F32)? {
            GgufWeight::Dense(w) => w,
            GgufWeight::Affine { .. } => {
                return Err(self.tensor_error(&name, "a norm weight is quantised".into()))
            }
        };
        norm_weight(stored, false)
    }
}

#[cfg(test)]
#[path = "gguf_tests.rs"]
mod model_tests;

/// A loaded tensor as a projection: float tensors dense, affine ones on MLX's quantized kernels.
impl From<GgufWeight> for Linear {
    fn from(weight: GgufWeight) -> Linear {
        match weight {
            GgufWeight::Dense(weight) => Linear::dense(weight),
            GgufWeight::Affine {
                weight,
                scales,
                biases,
                bits,
                group_size,
            } => Linear::affine(weight, scales, biases, group_size, bits),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::unpermute_order;

    /// llama.cpp's `permute`: `w.reshape(heads, 2, d/2, …).swapaxes(1, 2).reshape(w.shape)`.
    fn permute(rows: &[i32], heads: usize) -> Vec<i32> {
        let d = rows.len() / heads;
        let mut out = Vec::new();
        for h in 0..heads {
            for j in 0..d / 2 {
                for s in 0..2 {
                    out.push(rows[h * d + s * d / 2 + j]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermuting_undoes_llama_cpp_permutation() {
        let hf: Vec<i32> = (0..24).collect();
        for heads in [1, 2, 3] {
            let gguf = permute(&hf, heads);
            let order = unpermute_order(heads as i32, 24);
            let back: Vec<i32> = order.iter().map(|&r| gguf[r as usize]).collect();
            assert_eq!(back, hf, "heads {heads}");
        }
    }
}
