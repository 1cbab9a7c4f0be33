//! A `modern-bert` GGUF with a laya decision head, loaded into `model::encoder`'s types, with
//! the keys and tensor names llama.cpp's converter writes:
//!
//! - `modern-bert.block_count` counts the encoder's layers and the head's blocks, which are the
//!   last `modern-bert.decision.block_count` of them (`blk.L…`);
//! - `feed_forward_length` is one width or one per block (the head's blocks have their own);
//! - `attention.sliding_window` is the window's full width (ModernBERT's 128: 64 keys each
//!   side), `attention.sliding_window_pattern` where present says which layers are windowed
//!   (a count `n`: all but every `n`-th from layer 0; or one flag per layer), else every third
//!   from layer 0 (llama.cpp's converter writes no pattern for ModernBERT: its loader sets
//!   that one in code, from the architecture); `rope.freq_base` is the global layers' RoPE base,
//!   `rope.freq_base_swa` the windowed layers'. The window and the two bases are required: no
//!   default stands in for a value a ModernBERT was trained with;
//! - tensors: `token_embd`, `token_embd_norm`, per layer `attn_norm` (none on layer 0),
//!   `attn_qkv`, `attn_output`, `ffn_norm`, `ffn_up` (`[2·ffn, d]`), `ffn_down`, then
//!   `output_norm`; the head's blocks the same names with biases; `token_types` (`[3, d]`),
//!   `cls.norm`, `cls` (`[d, d]`), `cls.output` (`[d]` and `[1]`).
//!
//! Every missing key or tensor, and every shape that disagrees with the keys, refuses the file
//! by name. Quantised weights of the types the native integer products take (Q4_0 … Q8_0, Q4_K,
//! Q5_K, Q6_K) are decoded into their packing where this CPU has a SIMD copy of them; the rest
//! stay as stored (float, or Q4_0/Q4_1/Q8_0 as MLX affine arrays; other types dequantised to
//! float32); norms, biases and the head's vectors are read as float32.

use mlx_rs::Array;

use crate::checkpoint::gguf::{FloatDtype, GgufError, GgufFile, MetaValue};
use crate::model::encoder::{
    BidirectionalAttention, EncoderLayer, HeadBlock, MarkerHead, ModernBert, ModernBertConfig,
};
use crate::model::{linear::Linear, norm::LayerNorm};

/// The architecture name llama.cpp gives ModernBERT.
pub const MODERN_BERT: &str = "modern-bert";

/// ModernBERT's windowed-layer pattern where the file states none: layers 0, 3, 6, … global.
const DEFAULT_GLOBAL_EVERY: usize = 3;

/// Whether `file` is a ModernBERT GGUF (llama.cpp's `modern-bert`).
pub fn is_modern_bert(file: &GgufFile) -> bool {
    file.architecture() == Some(MODERN_BERT)
}

/// The encoder and its laya head from `file`; `pack`: whether quantised weights the native
/// integer products take are decoded into their packing (where this CPU runs them fast).
pub fn load_laya(file: &GgufFile, pack: bool) -> Result<(ModernBert, MarkerHead), GgufError> {
    let reader = Reader {
        file,
        pack: pack && hunch_kernels::quant::fast(),
    };
    let arch = MODERN_BERT;
    let key = |k: &str| format!("{arch}.{k}");
    let total = reader.count(&key("block_count"))?;
    let head_blocks = reader.count(&key("decision.block_count"))?;
    if head_blocks == 0 || head_blocks >= total {
        return Err(reader.metadata(
            &key("decision.block_count"),
            format!(
                "is {head_blocks} of {total} blocks; a laya model's head takes at least one \
                 block and leaves the encoder at least one"
            ),
        ));
    }
    let layers = total - head_blocks;
    let hidden = reader.count(&key("embedding_length"))?;
    let heads = reader.count(&key("attention.head_count"))?;
    if heads == 0 || !hidden.is_multiple_of(heads) {
        return Err(reader.metadata(
            &key("attention.head_count"),
            format!("{heads} heads do not divide the {hidden}-wide hidden state"),
        ));
    }
    let ffn = reader.encoder_ffn(&key("feed_forward_length"), layers)?;
    let eps = reader.float(&key("attention.layer_norm_epsilon"))?;
    let rope_base = reader.float(&key("rope.freq_base"))?;
    let rope_base_local = reader.float(&key("rope.freq_base_swa"))?;
    let sliding = reader.count(&key("attention.sliding_window"))?;
    let local_layers = reader.local_layers(&key("attention.sliding_window_pattern"), layers)?;
    reader.refuse_other_math(arch, (hidden / heads) as u64, heads as u64)?;
    let config = ModernBertConfig {
        hidden: hidden as i32,
        layers,
        heads: heads as i32,
        ffn: ffn as i32,
        eps,
        rope_base,
        rope_base_local,
        window: sliding / 2,
        local_layers,
        max_positions: reader.count(&key("context_length"))?,
    };
    let head_dim = config.head_dim();
    let (d, h) = (hidden, heads as i32);
    let attention = |prefix: &str, biased: bool| -> Result<BidirectionalAttention, GgufError> {
        Ok(BidirectionalAttention {
            qkv: reader.linear(&format!("{prefix}.attn_qkv.weight"), 3 * d, d)?,
            qkv_bias: biased
                .then(|| reader.vector(&format!("{prefix}.attn_qkv.bias"), 3 * d))
                .transpose()?,
            output: reader.linear(&format!("{prefix}.attn_output.weight"), d, d)?,
            output_bias: biased
                .then(|| reader.vector(&format!("{prefix}.attn_output.bias"), d))
                .transpose()?,
            heads: h,
            head_dim,
        })
    };
    let norm = |name: &str, biased: bool| -> Result<LayerNorm, GgufError> {
        let bias = biased
            .then(|| reader.vector(&format!("{name}.bias"), d))
            .transpose()?;
        Ok(LayerNorm::new(
            reader.vector(&format!("{name}.weight"), d)?,
            bias,
            eps,
        ))
    };
    let embeddings_info = reader.tensor("token_embd.weight")?;
    let vocab = match embeddings_info.shape().as_slice() {
        [vocab, width] if *width as usize == d && *vocab > 0 => *vocab as usize,
        shape => {
            return Err(file.tensor_error(
                embeddings_info,
                format!("has shape {shape:?}, [vocab, {d}] was expected"),
            ))
        }
    };
    let mut encoder_layers = Vec::with_capacity(layers);
    for l in 0..layers {
        let prefix = format!("blk.{l}");
        let attention_norm = if l == 0 {
            // ModernBERT's first layer has no attention norm; a file with one is not the
            // architecture this reads.
            if let Some(info) = file.tensor("blk.0.attn_norm.weight") {
                return Err(file.tensor_error(
                    info,
                    "ModernBERT's first layer has no attention norm".into(),
                ));
            }
            None
        } else {
            Some(norm(&format!("{prefix}.attn_norm"), false)?)
        };
        encoder_layers.push(EncoderLayer {
            attention_norm,
            attention: attention(&prefix, false)?,
            mlp_norm: norm(&format!("{prefix}.ffn_norm"), false)?,
            up: reader.linear(&format!("{prefix}.ffn_up.weight"), 2 * ffn, d)?,
            down: reader.linear(&format!("{prefix}.ffn_down.weight"), d, ffn)?,
        });
    }
    let encoder = ModernBert {
        config,
        embeddings: reader.embeddings("token_embd.weight", vocab, d)?,
        embeddings_norm: norm("token_embd_norm", false)?,
        layers: encoder_layers,
        final_norm: norm("output_norm", false)?,
        vocab,
    };
    let mut blocks = Vec::with_capacity(head_blocks);
    for b in layers..total {
        let prefix = format!("blk.{b}");
        let up_name = format!("{prefix}.ffn_up.weight");
        let up_info = reader.tensor(&up_name)?;
        let head_ffn = match up_info.shape().as_slice() {
            [rows, width] if *width as usize == d && *rows > 0 => *rows as usize,
            shape => {
                return Err(file.tensor_error(
                    up_info,
                    format!("has shape {shape:?}, [ffn, {d}] was expected"),
                ))
            }
        };
        blocks.push(HeadBlock {
            attention_norm: norm(&format!("{prefix}.attn_norm"), true)?,
            attention: attention(&prefix, true)?,
            mlp_norm: norm(&format!("{prefix}.ffn_norm"), true)?,
            up: reader.linear(&up_name, head_ffn, d)?,
            up_bias: reader.vector(&format!("{prefix}.ffn_up.bias"), head_ffn)?,
            down: reader.linear(&format!("{prefix}.ffn_down.weight"), d, head_ffn)?,
            down_bias: reader.vector(&format!("{prefix}.ffn_down.bias"), d)?,
        });
    }
    let head = MarkerHead {
        type_embeddings: reader.matrix("token_types.weight", 3, d)?,
        blocks,
        scorer_norm: norm("cls.norm", true)?,
        scorer: reader.linear("cls.weight", d, d)?,
        scorer_bias: reader.vector("cls.bias", d)?,
        output: reader.vector("cls.output.weight", d)?,
        output_bias: reader.vector("cls.output.bias", 1)?,
    };
    Ok((encoder, head))
}

struct Reader<'a> {
    file: &'a GgufFile,
    pack: bool,
}

impl Reader<'_> {
    fn metadata(&self, key: &str, why: String) -> GgufError {
        GgufError::Metadata {
            path: self.file.path().to_path_buf(),
            key: key.to_string(),
            why,
        }
    }

    /// A non-negative integer key, required.
    fn count(&self, key: &str) -> Result<usize, GgufError> {
        match self.file.get(key) {
            None => Err(self.metadata(key, "missing".into())),
            Some(value) => value
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| {
                    self.metadata(key, format!("is a {}, not a count", value.type_name()))
                }),
        }
    }

    fn float(&self, key: &str) -> Result<f32, GgufError> {
        self.optional_float(key)?
            .ok_or_else(|| self.metadata(key, "missing".into()))
    }

    fn optional_float(&self, key: &str) -> Result<Option<f32>, GgufError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(value) => value
                .as_f64()
                .map(|v| Some(v as f32))
                .filter(|v| v.is_some_and(|v| v.is_finite() && v > 0.0))
                .ok_or_else(|| self.metadata(key, "is not a positive number".into())),
        }
    }

    /// The encoder layers' one MLP width: the key's value, or its first `layers` entries where
    /// it lists one per block (they must agree).
    fn encoder_ffn(&self, key: &str, layers: usize) -> Result<usize, GgufError> {
        let Some(value) = self.file.get(key) else {
            return Err(self.metadata(key, "missing".into()));
        };
        let widths: Vec<u64> = match value.as_array() {
            Some(items) => items.iter().filter_map(MetaValue::as_u64).collect(),
            None => value.as_u64().into_iter().collect(),
        };
        let encoder = widths.get(..layers.min(widths.len())).unwrap_or(&[]);
        match encoder.first() {
            Some(&first) if first > 0 && encoder.iter().all(|&w| w == first) => Ok(first as usize),
            _ => Err(self.metadata(
                key,
                format!("{widths:?} gives the {layers} encoder layers no one width"),
            )),
        }
    }

    /// Which encoder layers attend within the window.
    fn local_layers(&self, key: &str, layers: usize) -> Result<Vec<bool>, GgufError> {
        let every = |n: usize| (0..layers).map(|l| !l.is_multiple_of(n)).collect();
        match self.file.get(key) {
            None => Ok(every(DEFAULT_GLOBAL_EVERY)),
            Some(value) => {
                if let Some(items) = value.as_array() {
                    let flags: Option<Vec<bool>> = items.iter().map(MetaValue::as_bool).collect();
                    match flags {
                        Some(flags) if flags.len() >= layers => Ok(flags[..layers].to_vec()),
                        _ => Err(self
                            .metadata(key, format!("is not one flag per layer ({layers} layers)"))),
                    }
                } else {
                    match value.as_u64() {
                        Some(n) if n > 0 => Ok(every(n as usize)),
                        _ => Err(self.metadata(key, "is not a positive count".into())),
                    }
                }
            }
        }
    }

    /// Keys that would change the math from what this reads: a value other than the one this
    /// computes is refused by name (grouped-query heads, a partial rotary, a causal mask, a
    /// rope scaling). Keys that do not change it (the embedding pooling, the vocabulary size,
    /// the model's name) are not needed and not read.
    fn refuse_other_math(&self, arch: &str, head_dim: u64, heads: u64) -> Result<(), GgufError> {
        let must_equal = [
            ("attention.head_count_kv", heads),
            ("rope.dimension_count", head_dim),
            ("attention.key_length", head_dim),
            ("attention.value_length", head_dim),
        ];
        for (name, expected) in must_equal {
            let key = format!("{arch}.{name}");
            if let Some(value) = self.file.get(&key) {
                if value.as_u64() != Some(expected) {
                    return Err(self.metadata(
                        &key,
                        format!("this reader computes {expected} (ModernBERT's), not {value:?}"),
                    ));
                }
            }
        }
        let causal = format!("{arch}.attention.causal");
        if self.file.boolean(&causal) == Some(true) {
            return Err(self.metadata(&causal, "an encoder's attention is bidirectional".into()));
        }
        let scaling = format!("{arch}.rope.scaling.type");
        if let Some(kind) = self.file.string(&scaling) {
            if kind != "none" {
                return Err(self.metadata(
                    &scaling,
                    format!("rope scaling {kind:?} is not ModernBERT's (none)"),
                ));
            }
        }
        Ok(())
    }

    fn tensor(&self, name: &str) -> Result<&crate::checkpoint::gguf::GgufTensorInfo, GgufError> {
        self.file.tensor(name).ok_or_else(|| GgufError::Missing {
            path: self.file.path().to_path_buf(),
            name: name.to_string(),
        })
    }

    fn expect_shape(&self, name: &str, shape: &[usize]) -> Result<(), GgufError> {
        let info = self.tensor(name)?;
        let actual: Vec<usize> = info.shape().iter().map(|&d| d as usize).collect();
        if actual == shape {
            Ok(())
        } else {
            Err(self.file.tensor_error(
                info,
                format!("has shape {actual:?}, {shape:?} was expected"),
            ))
        }
    }

    /// A `[rows, cols]` weight: a block type the native integer products take decoded into
    /// their packing where this CPU runs them faster than float32 products, else as stored.
    fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear, GgufError> {
        self.expect_shape(name, &[rows, cols])?;
        let info = self.tensor(name)?;
        if self.pack && crate::checkpoint::gguf::packs(info.ggml_type) {
            return Ok(Linear::packed(self.file.pack(info, None)?));
        }
        Ok(Linear::from(self.file.load(name, FloatDtype::F32)?))
    }

    /// The embedding, `[vocab, d]`: a packed model's rows stay in the mapping and are decoded
    /// as a prompt gathers them (a prompt reads a few hundred of a vocabulary's rows, so only
    /// their pages are ever resident), as a chat model's embedding does.
    fn embeddings(&self, name: &str, rows: usize, cols: usize) -> Result<Linear, GgufError> {
        self.expect_shape(name, &[rows, cols])?;
        let info = self.tensor(name)?;
        if self.pack && crate::checkpoint::gguf::packs(info.ggml_type) {
            return Ok(Linear::rows_from(std::sync::Arc::new(
                self.file.rows(info)?,
            )));
        }
        self.linear(name, rows, cols)
    }

    /// A tensor of `shape` as float32 values, whatever it is stored as.
    fn float32(&self, name: &str, shape: &[usize]) -> Result<Array, GgufError> {
        self.expect_shape(name, shape)?;
        self.file.load_float32(name)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Array, GgufError> {
        self.float32(name, &[len])
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Array, GgufError> {
        self.float32(name, &[rows, cols])
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::checkpoint::gguf::writer::Writer;

    fn tiny() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/decision/tiny-modernbert.laya.gguf")
    }

    /// A change made to the tiny file.
    type Change<'a> = dyn FnOnce(Writer) -> Writer + 'a;

    /// The load's error for the tiny file changed by `change`.
    fn refusal(change: impl FnOnce(Writer) -> Writer) -> String {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = GgufFile::open(&tiny()).expect("tiny laya file");
        let path = change(Writer::copy_of(&file)).write(dir.path(), "changed.gguf");
        let changed = GgufFile::open(&path).expect("changed file opens");
        match load_laya(&changed, true) {
            Ok(_) => panic!("the changed file loaded"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_tiny_file_loads_with_the_shape_its_keys_give() {
        let file = GgufFile::open(&tiny()).expect("tiny laya file");
        let (encoder, head) = load_laya(&file, true).expect("loads");
        let config = &encoder.config;
        assert_eq!((config.hidden, config.layers, config.heads), (64, 3, 4));
        assert_eq!((config.ffn, config.window), (96, 4));
        assert_eq!(config.local_layers, vec![false, true, true]);
        assert_eq!(
            (config.rope_base, config.rope_base_local),
            (160_000.0, 10_000.0)
        );
        assert!(encoder.layers[0].attention_norm.is_none());
        assert_eq!(head.blocks.len(), 2);
    }

    #[test]
    fn a_file_that_says_other_math_or_lacks_a_part_is_refused_by_name() {
        let key = |k: &str| format!("{MODERN_BERT}.{k}");
        let cases: Vec<(Box<Change<'_>>, &str)> = vec![
            (
                Box::new(|w: Writer| w.without_meta(&key("decision.block_count"))),
                "modern-bert.decision.block_count: missing",
            ),
            (
                Box::new(|w: Writer| w.without_meta(&key("rope.freq_base_swa"))),
                "modern-bert.rope.freq_base_swa: missing",
            ),
            (
                Box::new(|w: Writer| w.without_meta(&key("attention.sliding_window"))),
                "modern-bert.attention.sliding_window: missing",
            ),
            (
                Box::new(|w: Writer| {
                    w.set_meta(&key("attention.head_count_kv"), MetaValue::U32(2))
                }),
                "attention.head_count_kv",
            ),
            (
                Box::new(|w: Writer| w.set_meta(&key("attention.causal"), MetaValue::Bool(true))),
                "bidirectional",
            ),
            (
                Box::new(|w: Writer| {
                    w.set_meta(&key("rope.scaling.type"), MetaValue::String("yarn".into()))
                }),
                "rope scaling",
            ),
            (
                Box::new(|w: Writer| {
                    w.set_meta(
                        &key("feed_forward_length"),
                        MetaValue::Array([96u32, 64, 96, 128, 128].map(MetaValue::U32).to_vec()),
                    )
                }),
                "no one width",
            ),
            (
                Box::new(|w: Writer| w.without_tensor("token_types.weight")),
                "no tensor named token_types.weight",
            ),
            (
                Box::new(|w: Writer| w.without_tensor("blk.4.ffn_up.bias")),
                "blk.4.ffn_up.bias",
            ),
        ];
        for (change, expected) in cases {
            let err = refusal(change);
            assert!(err.contains(expected), "{err:?} lacks {expected:?}");
        }
    }
}
