//! DiffusionGemma, the diffusion family (docs/model.md): one type per block, one file each
//! (attention, the GeGLU MLP, the mixture of experts and its stacked experts, the layer, the
//! decoder's self-conditioning, RoPE), its configuration, and the whole model: encoder prefill
//! into a prompt cache, decoder passes over batches of canvases. Loading lives in the
//! checkpoint module; these types only hold arrays and compute.

pub mod attention;
pub mod config;
mod dispatch;
pub mod experts;
pub mod forward_io;
pub mod layer;
pub mod mlp;
pub mod moe;
pub mod reduce;
pub mod rope;
pub mod self_conditioning;

use mlx_rs::{ops, Array, Dtype};

pub use config::{AttentionKind, Config, ConfigError, LayerConfig, RopeConfig};
pub use experts::Experts;
pub use forward_io::{
    ActivationDtype, CanvasBatch, ChunkKv, ForwardOutput, PromptCache, PromptChunk,
    DEFAULT_PREFILL_CHUNK,
};

use self::{
    attention::{Attend, Segment},
    layer::Layer,
    reduce::SlotReduction,
    self_conditioning::SelfConditioning,
};
use crate::model::kv::{ChunkMasks, LayerKv};
use crate::model::{fused, linear::Linear, norm::RmsNorm, ModelError};

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
    /// Assembles a model from loaded blocks (the checkpoint module loads them).
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
        let dtype = dtype.compute()?;
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

    /// The dtype the activations are computed in ([`ActivationDtype::compute`]).
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

    /// Checks one prompt chunk of a forward.
    fn check_chunk(&self, chunk: &PromptChunk<'_>) -> Result<(), ModelError> {
        if chunk.ids.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        if let Some(bad) = chunk
            .past
            .iter()
            .find(|c| c.layers.len() != self.layers.len())
        {
            return Err(ModelError::CacheMismatch {
                expected: self.layers.len(),
                found: bad.layers.len(),
            });
        }
        self.check_tokens(chunk.ids)?;
        let start: usize = chunk.past.iter().map(ChunkKv::len).sum();
        self.check_length(start + chunk.ids.len())
    }

    /// Checks one canvas batch of a forward; returns (canvases, width).
    fn check_canvases(&self, batch: &CanvasBatch<'_>) -> Result<(i32, i32), ModelError> {
        let width = batch.canvases.first().map(Vec::len).unwrap_or(0);
        if width == 0 {
            return Err(ModelError::EmptyBatch);
        }
        if batch.cache.layers.len() != self.layers.len() {
            return Err(ModelError::CacheMismatch {
                expected: self.layers.len(),
                found: batch.cache.layers.len(),
            });
        }
        for (row, canvas) in batch.canvases.iter().enumerate() {
            if canvas.len() != width {
                return Err(ModelError::RaggedCanvases {
                    row,
                    width: canvas.len(),
                    expected: width,
                });
            }
            self.check_tokens(canvas)?;
        }
        self.check_length(batch.cache.len() + width)?;
        if let Some(&p) = batch
            .positions
            .and_then(|p| p.iter().find(|&&p| p >= width))
        {
            return Err(ModelError::PositionOutOfRange { position: p, width });
        }
        let unembedded = batch.positions.map_or(width, <[usize]>::len);
        if batch.labels.is_some_and(|l| l.len() != unembedded) {
            return Err(ModelError::Shape(
                "a canvas batch needs one label list per unembedded position",
            ));
        }
        let (b, w) = (batch.canvases.len() as i32, width as i32);
        let vocab = self.config.vocab_size;
        if let Some(sc) = batch.self_conditioning {
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
        Ok((b, w))
    }

    /// The layers over prompt chunks and canvas batches laid end to end (chunk rows first):
    /// returns the last layer's output `[1, N, hidden]` (lazy) and each chunk's K/V (lazy).
    fn run_layers(
        &self,
        chunks: &[PromptChunk<'_>],
        canvases: &[CanvasBatch<'_>],
        shapes: &[(i32, i32)],
    ) -> Result<(Array, Vec<ChunkKv>), ModelError> {
        let mut ids: Vec<u32> = chunks.iter().flat_map(|c| c.ids.iter().copied()).collect();
        let chunk_rows = ids.len() as i32;
        for batch in canvases {
            for canvas in batch.canvases {
                ids.extend_from_slice(canvas);
            }
        }
        let n = ids.len() as i32;
        let e = self.embed(&Array::from_slice(&ids, &[1, n]))?;
        // Canvases enter through self-conditioning (on the first step only its post-norm);
        // prompt chunks go straight into layer 0.
        let mut x = if canvases.is_empty() {
            e
        } else {
            let mut bounds = vec![chunk_rows];
            let mut at = chunk_rows;
            for &(b, w) in &shapes[..shapes.len() - 1] {
                at += b * w;
                bounds.push(at);
            }
            let mut parts = e.split_at_indices(&bounds, 1)?;
            for (part, (batch, &(b, w))) in parts[1..].iter_mut().zip(canvases.iter().zip(shapes)) {
                let hidden = part.dim(2);
                let conditioned = self.self_conditioning.forward(
                    &part.reshape(&[b, w, hidden])?,
                    batch.self_conditioning,
                    &self.embedding,
                    &self.embed_scale,
                )?;
                *part = conditioned.reshape(&[1, b * w, hidden])?;
            }
            if chunk_rows == 0 {
                parts.remove(0);
            }
            ops::concatenate(&parts, 1)?
        };
        let starts: Vec<i32> = chunks
            .iter()
            .map(|c| c.past.iter().map(|p| p.len).sum())
            .collect();
        let masks: Vec<ChunkMasks> = chunks
            .iter()
            .zip(&starts)
            .map(|(c, &start)| {
                let lens: Vec<i32> = c.past.iter().map(|p| p.len).collect();
                ChunkMasks::new(start, &lens, c.ids.len() as i32, self.config.sliding_window)
            })
            .collect();
        let mut chunk_layers: Vec<Vec<LayerKv>> =
            vec![Vec::with_capacity(self.layers.len()); chunks.len()];
        for (l, layer) in self.layers.iter().enumerate() {
            let mut segments = Vec::with_capacity(chunks.len() + canvases.len());
            for ((chunk, &start), masks) in chunks.iter().zip(&starts).zip(&masks) {
                segments.push(Segment {
                    rows: chunk.ids.len() as i32,
                    attend: Attend::Chunk {
                        start,
                        past: chunk.past.iter().map(|p| &p.layers[l]).collect(),
                        masks,
                    },
                });
            }
            for (batch, &(b, w)) in canvases.iter().zip(shapes) {
                segments.push(Segment {
                    rows: b * w,
                    attend: Attend::Canvas {
                        cache: &batch.cache.layers[l],
                        prompt_len: batch.cache.len,
                        batch: b,
                    },
                });
            }
            let (out, kvs) = layer.forward(&x, &segments)?;
            x = out;
            for (per_chunk, kv) in chunk_layers.iter_mut().zip(kvs) {
                per_chunk.push(kv);
            }
        }
        let chunk_kvs = chunk_layers
            .into_iter()
            .zip(chunks)
            .map(|(layers, c)| ChunkKv {
                layers,
                len: c.ids.len() as i32,
            })
            .collect();
        Ok((x, chunk_kvs))
    }

    /// One batched forward over prompt chunks (encoder) and canvas batches (decoder, one pass)
    /// of any number of reads. Token-wise work runs over all rows at once; attention runs per
    /// chunk or canvas batch with the shapes it has alone, so on a backend with row-independent
    /// matmuls each read's results are bit-identical to running it alone (docs/batching.md).
    /// Everything returned is evaluated (one blocking evaluation).
    pub fn forward(
        &self,
        chunks: &[PromptChunk<'_>],
        canvases: &[CanvasBatch<'_>],
    ) -> Result<ForwardOutput, ModelError> {
        let output = self.forward_lazy(chunks, canvases)?;
        mlx_rs::transforms::eval(output.outputs())?;
        Ok(output)
    }

    /// [`DiffusionGemma::forward`] without evaluating: the caller evaluates
    /// [`ForwardOutput::outputs`] — of this forward and of others that take its chunks' K/V as
    /// their past — in one blocking evaluation.
    pub fn forward_lazy(
        &self,
        chunks: &[PromptChunk<'_>],
        canvases: &[CanvasBatch<'_>],
    ) -> Result<ForwardOutput, ModelError> {
        if chunks.is_empty() && canvases.is_empty() {
            return Err(ModelError::EmptyBatch);
        }
        for chunk in chunks {
            self.check_chunk(chunk)?;
        }
        let shapes = canvases
            .iter()
            .map(|c| self.check_canvases(c))
            .collect::<Result<Vec<_>, _>>()?;
        let (x, chunk_kvs) = self.run_layers(chunks, canvases, &shapes)?;
        let vocab = self.config.vocab_size as usize;
        let mut rows = Vec::with_capacity(canvases.len());
        let logits = if canvases.is_empty() {
            None
        } else {
            let mut index: Vec<i32> = Vec::new();
            let mut base: i32 = chunks.iter().map(|c| c.ids.len() as i32).sum();
            for (batch, &(b, w)) in canvases.iter().zip(&shapes) {
                let first = index.len();
                for canvas in 0..b {
                    match batch.positions {
                        Some(positions) => {
                            index.extend(positions.iter().map(|&p| base + canvas * w + p as i32))
                        }
                        None => index.extend((0..w).map(|p| base + canvas * w + p)),
                    }
                }
                rows.push((first, index.len() - first));
                base += b * w;
            }
            let picked = x.take_axis(Array::from_slice(&index, &[index.len() as i32]), 1)?;
            let h = self.final_norm.forward(&picked)?;
            Some(
                self.unembed_lazy(&h)?
                    .reshape(&[index.len() as i32, vocab as i32])?,
            )
        };
        let reductions = match &logits {
            Some(all) => Self::reduce_batches(all, canvases, &rows)?,
            None => Vec::new(),
        };
        Ok(ForwardOutput {
            chunks: chunk_kvs,
            full_rows: canvases.iter().any(|c| c.labels.is_none()),
            logits,
            reductions,
            rows,
            vocab,
        })
    }

    /// The device reduction of each canvas batch that gave labels, over its own rows only (the
    /// shapes it has alone, so batching does not change its bits).
    fn reduce_batches(
        all: &Array,
        canvases: &[CanvasBatch<'_>],
        rows: &[(usize, usize)],
    ) -> Result<Vec<Option<SlotReduction>>, ModelError> {
        if canvases.iter().all(|c| c.labels.is_none()) {
            return Ok(Vec::new());
        }
        let parts = if rows.len() == 1 {
            vec![all.clone()]
        } else {
            let bounds: Vec<i32> = rows[1..].iter().map(|&(first, _)| first as i32).collect();
            all.split_at_indices(&bounds, 0)?
        };
        canvases
            .iter()
            .zip(parts)
            .zip(rows)
            .map(|((batch, part), &(_, count))| {
                let Some(labels) = batch.labels else {
                    return Ok(None);
                };
                let per_row: Vec<&[u32]> = labels
                    .iter()
                    .map(Vec::as_slice)
                    .cycle()
                    .take(count)
                    .collect();
                SlotReduction::new(part, &per_row).map(Some)
            })
            .collect()
    }

    /// The decoder's view of a prompt from its chunks' K/V: full layers keep every position,
    /// sliding layers the last `sliding_window - 1` (what transformers' sliding cache holds, and
    /// all the decoder may look at). Lazy: the joins run inside the first decoder pass that
    /// uses it, with no blocking evaluation of their own.
    pub fn prompt_cache(&self, chunks: &[ChunkKv]) -> Result<PromptCache, ModelError> {
        if chunks.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        if let Some(bad) = chunks.iter().find(|c| c.layers.len() != self.layers.len()) {
            return Err(ModelError::CacheMismatch {
                expected: self.layers.len(),
                found: bad.layers.len(),
            });
        }
        let len: i32 = chunks.iter().map(|c| c.len).sum();
        let keep_sliding = len.min(self.config.sliding_window - 1);
        let mut layers = Vec::with_capacity(self.layers.len());
        for (l, layer) in self.layers.iter().enumerate() {
            // Sliding layers: only the trailing chunks that cover the kept window.
            let mut first = 0;
            if layer.is_sliding() {
                let mut covered = 0;
                first = chunks.len();
                while first > 0 && covered < keep_sliding {
                    first -= 1;
                    covered += chunks[first].len;
                }
            }
            let used = &chunks[first..];
            let join = |pick: fn(&LayerKv) -> &Array| -> Result<Array, ModelError> {
                let parts: Vec<&Array> = used.iter().map(|c| pick(&c.layers[l])).collect();
                let all = if parts.len() == 1 {
                    parts[0].clone()
                } else {
                    ops::concatenate(&parts, 2)?
                };
                let total = all.dim(2);
                if layer.is_sliding() && total > keep_sliding {
                    Ok(all
                        .split_at_indices(&[total - keep_sliding], 2)?
                        .swap_remove(1))
                } else {
                    Ok(all)
                }
            };
            layers.push(LayerKv {
                keys: join(|kv| &kv.keys)?,
                values: join(|kv| &kv.values)?,
            });
        }
        Ok(PromptCache { layers, len })
    }

    /// The chunks' K/V of a whole prompt, prefilled chunk by chunk from position 0: each chunk's
    /// forward is built on the previous one's lazy K/V, and all are evaluated at once.
    pub fn prefill_chunks(
        &self,
        prompt_ids: &[u32],
        chunk: usize,
    ) -> Result<Vec<ChunkKv>, ModelError> {
        if prompt_ids.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        self.check_length(prompt_ids.len())?;
        let mut chunks: Vec<ChunkKv> = Vec::new();
        for ids in prompt_ids.chunks(chunk.max(1)) {
            let out = self.forward_lazy(&[PromptChunk { past: &chunks, ids }], &[])?;
            chunks.extend(out.chunks);
        }
        mlx_rs::transforms::eval(
            chunks
                .iter()
                .flat_map(|c| c.layers.iter().flat_map(|kv| [&kv.keys, &kv.values])),
        )?;
        Ok(chunks)
    }

    /// Encoder prefill of one prompt (batch 1) in chunks of `chunk` tokens from position 0:
    /// causal attention (sliding layers windowed), positions `0..P`.
    pub fn prefill_chunked(
        &self,
        prompt_ids: &[u32],
        chunk: usize,
    ) -> Result<PromptCache, ModelError> {
        let chunks = self.prefill_chunks(prompt_ids, chunk)?;
        self.prompt_cache(&chunks)
    }

    /// [`DiffusionGemma::prefill_chunked`] with [`DEFAULT_PREFILL_CHUNK`].
    pub fn prefill(&self, prompt_ids: &[u32]) -> Result<PromptCache, ModelError> {
        self.prefill_chunked(prompt_ids, DEFAULT_PREFILL_CHUNK)
    }

    /// The encoder's last hidden state `[1, P, hidden]` after the final norm (what transformers
    /// returns as `encoder(...).last_hidden_state`), the prompt taken as one chunk. For tests and
    /// diagnostics.
    pub fn encoder_hidden(&self, prompt_ids: &[u32]) -> Result<Array, ModelError> {
        let chunk = PromptChunk {
            past: &[],
            ids: prompt_ids,
        };
        self.check_chunk(&chunk)?;
        let (x, _) = self.run_layers(&[chunk], &[], &[])?;
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
        self.canvas_logits(cache, canvases, None, self_conditioning)
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
        self.canvas_logits(cache, canvases, Some(positions), None)
    }

    /// One decoder pass over `canvases` that unembeds `positions` (`None`: every position):
    /// logits `[B, positions, vocab]`, evaluated. What `denoise` and `denoise_at` both are.
    fn canvas_logits(
        &self,
        cache: &PromptCache,
        canvases: &[Vec<u32>],
        positions: Option<&[usize]>,
        self_conditioning: Option<&Array>,
    ) -> Result<Array, ModelError> {
        let out = self.forward(
            &[],
            &[CanvasBatch {
                cache,
                canvases,
                positions,
                self_conditioning,
                labels: None,
            }],
        )?;
        let width = match positions {
            Some(p) => p.len(),
            None => canvases.first().map(Vec::len).unwrap_or(0),
        };
        let logits = out.logits.ok_or(ModelError::EmptyBatch)?.reshape(&[
            canvases.len() as i32,
            width as i32,
            self.config.vocab_size,
        ])?;
        logits.eval()?;
        Ok(logits)
    }

    /// Tied unembedding, float32, softcap (lazy).
    fn unembed_lazy(&self, h: &Array) -> Result<Array, ModelError> {
        let logits = self.embedding.forward(h)?.as_dtype(Dtype::Float32)?;
        let logits = match self.config.final_logit_softcapping {
            Some(cap) => fused::softcap(&logits, cap)?,
            None => logits,
        };
        Ok(logits)
    }
}

// The server moves the model and its caches into a worker thread (MLX is not thread-safe, so
// one thread owns them): both must stay `Send`.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<DiffusionGemma>();
    assert_send::<PromptCache>();
    assert_send::<ChunkKv>();
};
