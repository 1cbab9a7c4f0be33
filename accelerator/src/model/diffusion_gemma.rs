//! The whole model: encoder prefill into a prompt cache, decoder passes over batches of canvases.

use std::str::FromStr;

use mlx_rs::{ops, Array, Dtype};

use super::{
    attention::LayerKv, config::Config, layer::Layer, linear::Linear, norm::RmsNorm,
    self_conditioning::SelfConditioning, ModelError,
};

/// Activation dtype (`--dtype`). Parity tests use float32; on the CPU float32 is also the
/// fastest (bf16 matmuls use no BLAS there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActivationDtype {
    /// float32 activations and weights.
    #[default]
    Float32,
    /// bfloat16 activations and weights (router softmax and logits stay float32).
    Bfloat16,
}

impl ActivationDtype {
    /// The MLX dtype.
    pub fn dtype(self) -> Dtype {
        match self {
            ActivationDtype::Float32 => Dtype::Float32,
            ActivationDtype::Bfloat16 => Dtype::Bfloat16,
        }
    }
}

impl FromStr for ActivationDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "float32" | "f32" | "fp32" => Ok(ActivationDtype::Float32),
            "bfloat16" | "bf16" => Ok(ActivationDtype::Bfloat16),
            other => Err(format!("unknown dtype {other:?}; use float32 or bfloat16")),
        }
    }
}

/// The encoder's K/V for one prompt (batch 1), read-only for the decoder.
#[derive(Clone, Debug)]
pub struct PromptCache {
    layers: Vec<LayerKv>,
    len: i32,
}

impl PromptCache {
    /// Number of prompt tokens (the decoder's first canvas position).
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the prompt was empty (never true for a cache `prefill` returned).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// DiffusionGemma: shared encoder/decoder weights, tied embedding.
#[derive(Debug)]
pub struct DiffusionGemma {
    config: Config,
    /// `[vocab, hidden]`; also the (tied) unembedding.
    embedding: Linear,
    /// √hidden rounded to the embedding's stored dtype (transformers multiplies in the weight
    /// dtype: 53.0 rather than 53.066 for bf16 at 2816), then cast to the activation dtype.
    embed_scale: Array,
    layers: Vec<Layer>,
    final_norm: RmsNorm,
    self_conditioning: SelfConditioning,
    dtype: Dtype,
}

impl DiffusionGemma {
    /// Assembles a model from loaded blocks (see `crate::checkpoint` for the loaders).
    /// `stored_dtype` is the embedding's dtype on disk, which fixes the rounding of √hidden.
    pub fn new(
        config: Config,
        embedding: Linear,
        stored_dtype: Dtype,
        layers: Vec<Layer>,
        final_norm: RmsNorm,
        self_conditioning: SelfConditioning,
        dtype: ActivationDtype,
    ) -> Result<Self, ModelError> {
        let dtype = dtype.dtype();
        let embed_scale = Array::from_f32((config.hidden_size as f32).sqrt())
            .as_dtype(stored_dtype)?
            .as_dtype(dtype)?;
        embed_scale.eval()?;
        Ok(Self {
            config,
            embedding,
            embed_scale,
            layers,
            final_norm,
            self_conditioning,
            dtype,
        })
    }

    /// The configuration the model was loaded with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The activation dtype.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn check_tokens(&self, ids: &[u32]) -> Result<(), ModelError> {
        let vocab = self.config.vocab_size;
        match ids.iter().find(|&&t| t as i64 >= vocab as i64) {
            Some(&token) => Err(ModelError::TokenOutOfRange { token, vocab }),
            None => Ok(()),
        }
    }

    fn check_length(&self, needed: usize) -> Result<(), ModelError> {
        match self.config.max_position_embeddings {
            Some(max) if needed > max as usize => Err(ModelError::TooLong { needed, max }),
            _ => Ok(()),
        }
    }

    /// `embed(ids) · √hidden` in the activation dtype.
    fn embed(&self, ids: &Array) -> Result<Array, ModelError> {
        let e = self.embedding.rows(ids)?.as_dtype(self.dtype)?;
        Ok(ops::multiply(e, &self.embed_scale)?)
    }

    fn encode(&self, prompt_ids: &[u32]) -> Result<(Array, Vec<LayerKv>), ModelError> {
        if prompt_ids.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        self.check_tokens(prompt_ids)?;
        self.check_length(prompt_ids.len())?;
        let p = prompt_ids.len() as i32;
        let ids = Array::from_slice(prompt_ids, &[1, p]);
        let mut x = self.embed(&ids)?;
        let mut kvs = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (out, kv) = layer.prefill(&x)?;
            x = out;
            kvs.push(kv);
        }
        Ok((x, kvs))
    }

    /// Encoder prefill of one prompt (batch 1): causal attention, positions `0..P`; returns the
    /// K/V of every layer (sliding layers: only the last `sliding_window - 1` positions).
    pub fn prefill(&self, prompt_ids: &[u32]) -> Result<PromptCache, ModelError> {
        let (_, layers) = self.encode(prompt_ids)?;
        // Materialise the cache now, so each decoder pass does not recompute the encoder.
        let arrays: Vec<&Array> = layers
            .iter()
            .flat_map(|kv| [&kv.keys, &kv.values])
            .collect();
        mlx_rs::transforms::eval(arrays)?;
        Ok(PromptCache {
            layers,
            len: prompt_ids.len() as i32,
        })
    }

    /// The encoder's last hidden state `[1, P, hidden]` after the final norm (what transformers
    /// returns as `encoder(...).last_hidden_state`). For tests and diagnostics.
    pub fn encoder_hidden(&self, prompt_ids: &[u32]) -> Result<Array, ModelError> {
        let (x, _) = self.encode(prompt_ids)?;
        let h = self.final_norm.forward(&x)?;
        h.eval()?;
        Ok(h)
    }

    /// One decoder pass over `canvases` (B rows of equal width W) at positions `P..P+W`, against
    /// the read-only prompt cache. `self_conditioning`: the previous step's logits
    /// `[B or 1, W, vocab]`, or `None` on the first step (every read). Returns softcapped float32
    /// logits `[B, W, vocab]`, evaluated.
    pub fn denoise(
        &self,
        cache: &PromptCache,
        canvases: &[Vec<u32>],
        self_conditioning: Option<&Array>,
    ) -> Result<Array, ModelError> {
        let h = self.decoder_hidden(cache, canvases, self_conditioning)?;
        self.unembed(&h)
    }

    /// A first-step decoder pass (no self-conditioning) that unembeds only the canvas positions
    /// in `positions`: softcapped float32 logits `[B, positions.len(), vocab]`, evaluated. A
    /// read needs the label slots alone, and the tied unembedding over a 262k vocabulary is the
    /// largest matmul of the pass, so skipping the other canvas positions saves most of it.
    /// Row for row identical to the same positions of [`DiffusionGemma::denoise`].
    pub fn denoise_at(
        &self,
        cache: &PromptCache,
        canvases: &[Vec<u32>],
        positions: &[usize],
    ) -> Result<Array, ModelError> {
        let h = self.decoder_hidden(cache, canvases, None)?;
        let index: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
        let rows = h.take_axis(Array::from_slice(&index, &[index.len() as i32]), 1)?;
        self.unembed(&rows)
    }

    /// Final-normed decoder hidden states `[B, W, hidden]` (lazy).
    fn decoder_hidden(
        &self,
        cache: &PromptCache,
        canvases: &[Vec<u32>],
        self_conditioning: Option<&Array>,
    ) -> Result<Array, ModelError> {
        let width = canvases.first().map(Vec::len).unwrap_or(0);
        if width == 0 {
            return Err(ModelError::EmptyBatch);
        }
        if cache.layers.len() != self.layers.len() {
            return Err(ModelError::CacheMismatch {
                expected: self.layers.len(),
                found: cache.layers.len(),
            });
        }
        let mut flat = Vec::with_capacity(canvases.len() * width);
        for (row, canvas) in canvases.iter().enumerate() {
            if canvas.len() != width {
                return Err(ModelError::RaggedCanvases {
                    row,
                    width: canvas.len(),
                    expected: width,
                });
            }
            flat.extend_from_slice(canvas);
        }
        self.check_tokens(&flat)?;
        self.check_length(cache.len() + width)?;
        let (b, w) = (canvases.len() as i32, width as i32);
        let vocab = self.config.vocab_size;
        if let Some(sc) = self_conditioning {
            let s = sc.shape();
            if s.len() != 3 || (s[0] != b && s[0] != 1) || s[1] != w || s[2] != vocab {
                return Err(ModelError::SelfConditioningShape {
                    found: s.to_vec(),
                    batch: b,
                    width: w,
                    vocab,
                });
            }
        }
        let ids = Array::from_slice(&flat, &[b, w]);
        let e = self.embed(&ids)?;
        let mut x = self.self_conditioning.forward(
            &e,
            self_conditioning,
            &self.embedding,
            &self.embed_scale,
        )?;
        for (layer, kv) in self.layers.iter().zip(&cache.layers) {
            x = layer.denoise(&x, kv, cache.len)?;
        }
        self.final_norm.forward(&x)
    }

    /// Tied unembedding, float32, softcap; evaluated.
    fn unembed(&self, h: &Array) -> Result<Array, ModelError> {
        let logits = self.embedding.forward(h)?.as_dtype(Dtype::Float32)?;
        let logits = match self.config.final_logit_softcapping {
            Some(cap) => {
                let cap = Array::from_f32(cap);
                ops::multiply(ops::tanh(ops::divide(&logits, &cap)?)?, &cap)?
            }
            None => logits,
        };
        logits.eval()?;
        Ok(logits)
    }
}

// The server moves the model and its caches into a worker thread (MLX is not thread-safe, so
// one thread owns them): both must stay `Send`.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<DiffusionGemma>();
    assert_send::<PromptCache>();
};
