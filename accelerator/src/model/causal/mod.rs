//! Causal chat models (Llama, Mistral, Qwen2, Qwen3, Gemma 3 text) over shared blocks, for the label-logit
//! read (docs/logit-read.md).
//!
//! - [`config`]: the flattened configuration and the architectures;
//! - [`keys`]: every config key accounted for (honoured, harmless, or refused by name);
//! - [`rope`]: the rope variants, read from either transformers dialect, and their frequencies;
//! - [`llama`] (with Mistral), [`qwen2`], [`qwen3`], [`gemma3`]: each architecture's
//!   `config.json` and what sets it apart;
//! - [`blocks`]: RoPE, attention over prompt chunks, the gated MLP, the decoder layer;
//! - [`cpu`]: the native CPU forward of a prompt chunk (vectorised kernels, the BLAS's sgemm),
//!   chosen by [`CausalKernels`];
//! - this file: [`CausalLm`], the stack, run one prompt chunk at a time, and the label logits.
//!
//! Loading (Hugging Face folders, GGUF files) lives in `checkpoint::causal`; these types only
//! hold arrays and compute. Activations are float32: the read is one pass over a short prompt,
//! and MLX's CPU backend runs narrower products in a slow portable loop (`model::widened`).

pub mod blocks;
pub mod config;
pub mod cpu;
pub mod gemma3;
pub mod keys;
pub mod llama;
pub mod qwen2;
pub mod qwen3;
pub mod rope;

use mlx_rs::{ops, Array, Dtype};

use crate::model::kv::{ChunkMasks, LayerKv};
use crate::model::{fused, linear::Linear, norm::RmsNorm, ModelError};
pub use blocks::{CausalAttention, CausalRope, DecoderLayer, GatedMlp};
pub use config::{Activation, Architecture, CausalConfig, ConfigError, RopeScaling, RopeSpec};
pub use cpu::CausalKernels;

/// Prompt tokens per chunk unless the sidecar is told otherwise (`--prefill-chunk`): the unit
/// of prefix sharing. Smaller chunks share more of two prompts, larger ones make better use of
/// the BLAS (on SmolLM2's v1 prompts, 2 cores: 128 read 15% faster than 64, 30% than 32;
/// docs/benchmarks.md).
pub const DEFAULT_CAUSAL_CHUNK: usize = 128;

/// The K/V one prompt chunk left in every layer, with the tokens it covers. Cloning shares the
/// arrays (MLX handles), so a cached chunk is restored without a copy.
#[derive(Clone, Debug)]
pub struct CausalChunk {
    /// The chunk's tokens (its position is the sum of the earlier chunks' lengths).
    pub tokens: Vec<u32>,
    /// Per layer, `[1, kv_heads, len, head_dim]` keys and values (normed and rotated).
    pub kv: Vec<LayerKv>,
}

impl CausalChunk {
    /// The chunk's first `n` positions: its tokens and each layer's keys and values cut there,
    /// or `None` where its arrays are not the native path's float32 `[1, kv_heads, len,
    /// head_dim]` (only a model whose bits do not depend on the split,
    /// [`CausalLm::splits_anywhere`], may be restored from part of a chunk: a position's keys and
    /// values then depend only on the tokens up to it).
    pub fn prefix(&self, n: usize) -> Option<CausalChunk> {
        let len = self.tokens.len();
        if n == 0 || n > len {
            return None;
        }
        let cut = |a: &Array| -> Option<Array> {
            let shape = a.shape();
            if a.dtype() != mlx_rs::Dtype::Float32 || shape.len() != 4 || shape[2] as usize != len {
                return None;
            }
            let (heads, d) = (shape[1] as usize, shape[3] as usize);
            let data = a.try_as_slice::<f32>().ok()?;
            let mut out = Vec::with_capacity(heads * n * d);
            for h in 0..heads {
                out.extend_from_slice(&data[h * len * d..(h * len + n) * d]);
            }
            Some(Array::from_slice(
                &out,
                &[1, heads as i32, n as i32, d as i32],
            ))
        };
        let kv = self
            .kv
            .iter()
            .map(|kv| {
                Some(LayerKv {
                    keys: cut(&kv.keys)?,
                    values: cut(&kv.values)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(CausalChunk {
            tokens: self.tokens[..n].to_vec(),
            kv,
        })
    }

    /// Bytes its arrays hold.
    pub fn nbytes(&self) -> usize {
        self.kv
            .iter()
            .map(|kv| kv.keys.nbytes() + kv.values.nbytes())
            .sum()
    }
}

/// A loaded causal language model.
pub struct CausalLm {
    config: CausalConfig,
    embedding: Linear,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `None`: the head is the embedding (tied).
    head: Option<Linear>,
    /// The weights prepared for the native CPU path when prompt chunks run on it
    /// ([`CausalLm::select_kernels`]).
    native: Option<cpu::Packed>,
}

impl CausalLm {
    /// From its parts (built by `checkpoint::causal`).
    pub fn new(
        config: CausalConfig,
        embedding: Linear,
        layers: Vec<DecoderLayer>,
        norm: RmsNorm,
        head: Option<Linear>,
    ) -> Result<Self, ModelError> {
        if layers.len() != config.num_layers as usize {
            return Err(ModelError::Shape("layer count differs from the config"));
        }
        let mut lm = CausalLm {
            config,
            embedding,
            layers,
            norm,
            head,
            native: None,
        };
        // The default is the engine's: native on the CPU where every weight qualifies.
        lm.select_kernels(CausalKernels::Auto)?;
        Ok(lm)
    }

    /// Chooses what runs prompt chunks and returns what was chosen (`Mlx` or `Native`).
    /// `Auto` is native when MLX's default device is the CPU and every weight qualifies
    /// ([`cpu`]); `Native` where they do not is an error that names the first weight that does
    /// not.
    pub fn select_kernels(&mut self, wanted: CausalKernels) -> Result<CausalKernels, ModelError> {
        // Prepared already (the constructor chose `Auto`): the same weights would come out.
        let prepared_as_asked = match wanted {
            CausalKernels::Auto => true,
            CausalKernels::Native => cpu::kernels::quant::fast(),
            CausalKernels::Mlx => false,
        };
        if self.native.is_some() && prepared_as_asked {
            return Ok(self.kernels());
        }
        self.native = match wanted {
            CausalKernels::Mlx => None,
            CausalKernels::Native => {
                Some(cpu::prepare(&self.weights(), true).map_err(ModelError::NativeKernels)?)
            }
            CausalKernels::Auto => {
                if crate::model::widened::cpu_backend().unwrap_or(false) {
                    cpu::prepare(&self.weights(), false).ok()
                } else {
                    None
                }
            }
        };
        Ok(self.kernels())
    }

    /// How finely the native integer products round their inputs (`Fine`, about 16 bits, by
    /// default; `Coarse`, 8 bits as llama.cpp rounds them): docs/logit-read.md, "Kernels".
    /// No effect where no weight runs on them.
    pub fn set_activation_precision(&mut self, precision: cpu::kernels::quant::Precision) {
        if let Some(packed) = &mut self.native {
            packed.set_precision(precision);
        }
    }

    /// Whether quantised projections run on the native integer products.
    pub fn integer_products(&self) -> bool {
        self.native.as_ref().is_some_and(cpu::Packed::any)
    }

    /// Whether a position's K/V and hidden state are the same bits however the prompt before it
    /// is split into chunks: the native path with every projection on the integer products
    /// (whose rows are independent) and its row-by-row attention. The engine then shares a
    /// prompt's prefix to the exact token (docs/logit-read.md, "Exactness").
    pub fn splits_anywhere(&self) -> bool {
        self.native.as_ref().is_some_and(cpu::Packed::all)
    }

    /// Bytes the native path's prepared weights hold, repacked or widened (0 on the MLX path or
    /// where every weight is float32).
    pub fn packed_bytes(&self) -> usize {
        self.native.as_ref().map_or(0, cpu::Packed::bytes)
    }

    /// What the native path reads of the model.
    fn weights(&self) -> cpu::Weights<'_> {
        cpu::Weights {
            config: &self.config,
            embedding: &self.embedding,
            layers: &self.layers,
            norm: &self.norm,
        }
    }

    /// What runs prompt chunks now: `Mlx` or `Native`.
    pub fn kernels(&self) -> CausalKernels {
        if self.native.is_some() {
            CausalKernels::Native
        } else {
            CausalKernels::Mlx
        }
    }

    /// The kernels' name in fingerprints: `mlx`, or `native-` and the instruction set, with the
    /// integer products' where quantised weights run on them (each rounds differently).
    pub fn kernels_name(&self) -> String {
        match &self.native {
            Some(packed) => cpu::native_name(packed),
            None => "mlx".to_owned(),
        }
    }

    pub fn config(&self) -> &CausalConfig {
        &self.config
    }

    /// Runs several chunks, each after its own earlier chunks, as [`CausalLm::forward_chunk`]
    /// runs each: where the model splits anywhere ([`CausalLm::splits_anywhere`]) their rows go
    /// through each layer together (one pass over the weights for all of them), with the very
    /// bits each gets alone; elsewhere one after another.
    pub fn forward_batch(
        &self,
        chunks: &[(&[u32], &[CausalChunk])],
    ) -> Result<Vec<(CausalChunk, Array)>, ModelError> {
        let last: Vec<Vec<usize>> = chunks
            .iter()
            .map(|(tokens, _)| vec![tokens.len().saturating_sub(1)])
            .collect();
        self.forward_batch_rows(chunks, &last)?
            .into_iter()
            .map(|(chunk, mut hidden)| Ok((chunk, hidden.pop().ok_or(ModelError::EmptyPrompt)?)))
            .collect()
    }

    /// [`CausalLm::forward_batch`], each chunk giving its hidden states after the final norm
    /// (`[hidden]` each) at its positions `rows[i]` (counted from the chunk's start) rather
    /// than at its last: a pointer read takes several positions of a prompt.
    pub fn forward_batch_rows(
        &self,
        chunks: &[(&[u32], &[CausalChunk])],
        rows: &[Vec<usize>],
    ) -> Result<Vec<(CausalChunk, Vec<Array>)>, ModelError> {
        if rows.len() != chunks.len() {
            return Err(ModelError::Shape("one list of rows per chunk"));
        }
        let Some(packed) = self.native.as_ref().filter(|p| p.all() && chunks.len() > 1) else {
            return chunks
                .iter()
                .zip(rows)
                .map(|((tokens, past), rows)| self.forward_chunk_rows(tokens, past, rows))
                .collect();
        };
        let pasts: Vec<Vec<cpu::PastChunk<'_>>> = chunks
            .iter()
            .map(|(_, past)| {
                past.iter()
                    .map(|c| cpu::PastChunk {
                        len: c.tokens.len(),
                        kv: &c.kv,
                    })
                    .collect()
            })
            .collect();
        let items: Vec<(&[u32], &[cpu::PastChunk<'_>])> = chunks
            .iter()
            .zip(&pasts)
            .map(|((tokens, _), past)| (*tokens, &past[..]))
            .collect();
        let done = cpu::forward_batch_rows(&self.weights(), packed, &items, rows)?;
        Ok(done
            .into_iter()
            .zip(chunks)
            .map(|((kv, hidden), (tokens, _))| {
                (
                    CausalChunk {
                        tokens: tokens.to_vec(),
                        kv,
                    },
                    hidden,
                )
            })
            .collect())
    }

    /// Runs one chunk of `tokens` after the chunks `past` (in order, the same prompt's earlier
    /// chunks) and returns the chunk's K/V and its last position's hidden state after the final
    /// norm (`[hidden]`, float32), everything evaluated.
    pub fn forward_chunk(
        &self,
        tokens: &[u32],
        past: &[CausalChunk],
    ) -> Result<(CausalChunk, Array), ModelError> {
        let last = [tokens.len().saturating_sub(1)];
        let (chunk, mut hidden) = self.forward_chunk_rows(tokens, past, &last)?;
        Ok((chunk, hidden.pop().ok_or(ModelError::EmptyPrompt)?))
    }

    /// [`CausalLm::forward_chunk`] giving the hidden states after the final norm at the chunk's
    /// positions `rows` (counted from its start), in that order.
    pub fn forward_chunk_rows(
        &self,
        tokens: &[u32],
        past: &[CausalChunk],
        rows: &[usize],
    ) -> Result<(CausalChunk, Vec<Array>), ModelError> {
        if let Some(packed) = &self.native {
            let past: Vec<cpu::PastChunk<'_>> = past
                .iter()
                .map(|c| cpu::PastChunk {
                    len: c.tokens.len(),
                    kv: &c.kv,
                })
                .collect();
            let mut done = cpu::forward_batch_rows(
                &self.weights(),
                packed,
                &[(tokens, &past[..])],
                &[rows.to_vec()],
            )?;
            let (kv, hidden) = done.pop().ok_or(ModelError::EmptyPrompt)?;
            return Ok((
                CausalChunk {
                    tokens: tokens.to_vec(),
                    kv,
                },
                hidden,
            ));
        }
        if tokens.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        if rows.iter().any(|&r| r >= tokens.len()) {
            return Err(ModelError::Shape("a hidden state asked outside its chunk"));
        }
        let past_lens: Vec<i32> = past.iter().map(|c| c.tokens.len() as i32).collect();
        let start: i32 = past_lens.iter().sum();
        let len = tokens.len() as i32;
        let window = if self.config.sliding_layers.iter().any(|&s| s) {
            self.config.sliding_window
        } else {
            i32::MAX
        };
        let masks = ChunkMasks::new(start, &past_lens, len, window);
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let ids = Array::from_slice(&ids, &[1, len]);
        let mut x = self.embedding.rows(&ids)?.as_dtype(Dtype::Float32)?;
        if let Some(scale) = self.config.embedding_scale() {
            x = ops::multiply(&x, Array::from_f32(scale))?;
        }
        let mut kv = Vec::with_capacity(self.layers.len());
        for (index, layer) in self.layers.iter().enumerate() {
            let layer_past: Vec<&LayerKv> = past.iter().map(|c| &c.kv[index]).collect();
            let (next, layer_kv) = layer.forward(&x, start, &layer_past, &masks)?;
            x = next;
            kv.push(layer_kv);
        }
        // Each asked position normed alone, as a `[hidden]` vector.
        let hidden = rows
            .iter()
            .map(|&r| {
                let row = x
                    .take_axis(Array::from_slice(&[r as i32], &[1]), 1)?
                    .reshape(&[self.config.hidden_size])?;
                self.norm.forward(&row)
            })
            .collect::<Result<Vec<Array>, ModelError>>()?;
        let mut outputs: Vec<&Array> = hidden.iter().collect();
        for layer_kv in &kv {
            outputs.push(&layer_kv.keys);
            outputs.push(&layer_kv.values);
        }
        mlx_rs::transforms::eval(outputs)?;
        Ok((
            CausalChunk {
                tokens: tokens.to_vec(),
                kv,
            },
            hidden,
        ))
    }

    /// The prompt `tokens` in chunks of `chunk` from position 0, without a cache (tests, tools):
    /// its chunks and the last position's normed hidden state.
    pub fn prefill(
        &self,
        tokens: &[u32],
        chunk: usize,
    ) -> Result<(Vec<CausalChunk>, Array), ModelError> {
        let mut chunks: Vec<CausalChunk> = Vec::new();
        let mut hidden = None;
        for piece in tokens.chunks(chunk.max(1)) {
            let (done, h) = self.forward_chunk(piece, &chunks)?;
            chunks.push(done);
            hidden = Some(h);
        }
        let hidden = hidden.ok_or(ModelError::EmptyPrompt)?;
        Ok((chunks, hidden))
    }

    /// The logits of `ids` at a position whose normed hidden state is `hidden` (`[hidden]`):
    /// only those rows of the head are read, so a label read costs a few dot products, not a
    /// pass over the vocabulary.
    pub fn label_logits(&self, hidden: &Array, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        if ids.iter().any(|&id| id as i32 >= self.config.vocab_size) {
            return Err(ModelError::Shape("a label id is outside the vocabulary"));
        }
        let rows = Array::from_slice(
            &ids.iter().map(|&i| i as i32).collect::<Vec<_>>(),
            &[ids.len() as i32],
        );
        let head = self.head.as_ref().unwrap_or(&self.embedding);
        let weights = head.rows(&rows)?.as_dtype(Dtype::Float32)?;
        let logits = ops::matmul(&weights, hidden)?;
        self.finish(logits)
    }

    /// Every logit at that position (`[vocab]`): tests and tools compare the whole head.
    pub fn all_logits(&self, hidden: &Array) -> Result<Vec<f32>, ModelError> {
        let head = self.head.as_ref().unwrap_or(&self.embedding);
        let logits = head
            .forward(&hidden.reshape(&[1, self.config.hidden_size])?)?
            .as_dtype(Dtype::Float32)?
            .reshape(&[self.config.vocab_size])?;
        self.finish(logits)
    }

    fn finish(&self, logits: Array) -> Result<Vec<f32>, ModelError> {
        let logits = match self.config.final_logit_softcapping {
            Some(cap) => fused::softcap(&logits, cap)?,
            None => logits,
        };
        logits.eval()?;
        Ok(logits
            .try_as_slice::<f32>()
            .map_err(|_| ModelError::Shape("logits are not contiguous float32"))?
            .to_vec())
    }

    /// Bytes of K/V one prompt token takes across the layers (for cache budgets).
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.layers.len() * (self.config.num_kv_heads * self.config.head_dim) as usize * 4
    }
}
