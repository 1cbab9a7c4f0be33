//! What goes into and comes out of the model's forward passes: the activation dtype, the
//! prompt's K/V (whole and per chunk), the chunks and canvas batches one forward runs, and its
//! outputs (logits or their on-device label reduction).

use std::str::FromStr;

use mlx_rs::{Array, Dtype};

use super::reduce::SlotSummary;

use super::reduce::SlotReduction;
use crate::model::{kv::LayerKv, ModelError};

/// The model's dtype (`--dtype`): what its dense weights are held in and, where MLX has fast
/// kernels for it, what its activations are computed in ([`ActivationDtype::compute`]). Parity
/// tests use float32. On MLX's CPU backend bfloat16 holds the weights in bf16 (half float32's
/// memory) and computes in float32, widening each weight per call (`model::widened`): MLX's CPU
/// has no fast bf16 kernels, neither for products nor for elementwise work, so bf16 activations
/// there cost 1.2–1.6× float32's time on small models, while float32 activations over bf16
/// weights take about float32's time (docs/mlx-on-linux.md, "bfloat16 on the CPU").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActivationDtype {
    /// float32 activations and weights.
    #[default]
    Float32,
    /// bfloat16 weights; bfloat16 activations on a GPU, float32 ones on the CPU (router softmax
    /// and logits are float32 everywhere).
    Bfloat16,
}

impl ActivationDtype {
    /// The MLX dtype the dense weights are held in.
    pub fn dtype(self) -> Dtype {
        match self {
            ActivationDtype::Float32 => Dtype::Float32,
            ActivationDtype::Bfloat16 => Dtype::Bfloat16,
        }
    }

    /// The MLX dtype the activations (and the prompt's K/V) are computed in on MLX's default
    /// device: the held dtype, except bfloat16 on the CPU, which computes in float32.
    pub fn compute(self) -> Result<Dtype, ModelError> {
        Ok(match self {
            ActivationDtype::Bfloat16 if crate::model::widened::cpu_backend()? => Dtype::Float32,
            other => other.dtype(),
        })
    }
}

impl ActivationDtype {
    /// The default where none is asked for: bfloat16 when MLX's default device is a GPU (CUDA,
    /// Metal: tensor-core kernels, half the memory traffic, and batching there measured
    /// bit-exact, docs/batching.md), float32 on the CPU: what the parity goldens check, and its
    /// experts keep `gather_mm`'s per-pair products, whose bits do not depend on what else a
    /// request reads. On the CPU bf16 computes in float32 too, over bf16 weights: half the
    /// memory at about float32's time (docs/mlx-on-linux.md, issue 24).
    pub fn for_default_device() -> ActivationDtype {
        let gpu = mlx_rs::Device::try_default()
            .and_then(|d| d.get_type())
            .is_ok_and(|t| matches!(t, mlx_rs::DeviceType::Gpu));
        if gpu {
            ActivationDtype::Bfloat16
        } else {
            ActivationDtype::Float32
        }
    }
}

/// A `--dtype` that is not an activation dtype.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype {0:?}; use float32 or bfloat16")]
pub struct UnknownDtype(pub String);

impl FromStr for ActivationDtype {
    type Err = UnknownDtype;
    fn from_str(s: &str) -> Result<Self, UnknownDtype> {
        match s {
            "float32" | "f32" | "fp32" => Ok(ActivationDtype::Float32),
            "bfloat16" | "bf16" => Ok(ActivationDtype::Bfloat16),
            other => Err(UnknownDtype(other.to_string())),
        }
    }
}

/// Prefill chunk length used when none is configured. Every prefill of a server uses one chunk
/// length, so chunk boundaries (and with them the prefix cache's reuse points) are aligned from
/// position 0 and a prompt computes the same bits cold or warm.
pub const DEFAULT_PREFILL_CHUNK: usize = 128;

/// The encoder's K/V for one prompt (batch 1), read-only for the decoder.
#[derive(Clone, Debug)]
pub struct PromptCache {
    pub(super) layers: Vec<LayerKv>,
    pub(super) len: i32,
}

/// The K/V of one prompt chunk for every layer (all of its positions, sliding layers too): what a
/// read accumulates while it prefills and what the prefix cache keeps.
#[derive(Clone, Debug)]
pub struct ChunkKv {
    pub(super) layers: Vec<LayerKv>,
    pub(super) len: i32,
}

impl ChunkKv {
    /// Tokens in the chunk.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Never true for a chunk a forward returned.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of K/V held.
    pub fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|kv| (kv.keys.nbytes() + kv.values.nbytes()) as u64)
            .sum()
    }
}

/// One prompt chunk of a batched forward: its token ids and the chunks before it.
#[derive(Clone, Copy, Debug)]
pub struct PromptChunk<'a> {
    /// The K/V of the prompt's earlier chunks, in order (empty for the first chunk).
    pub past: &'a [ChunkKv],
    pub ids: &'a [u32],
}

/// One read's canvases in a batched forward.
#[derive(Clone, Copy, Debug)]
pub struct CanvasBatch<'a> {
    pub cache: &'a PromptCache,
    /// All the same width.
    pub canvases: &'a [Vec<u32>],
    /// Canvas positions to unembed (every position when `None`).
    pub positions: Option<&'a [usize]>,
    /// The previous step's logits `[B or 1, W, vocab]`; `None` on the first step (every read).
    pub self_conditioning: Option<&'a Array>,
    /// The label ids of each unembedded position: with them the batch's logits are reduced on
    /// the device ([`ForwardOutput::slot_summaries`]) and never copied whole; `None` returns
    /// full logits rows ([`ForwardOutput::logits`]).
    pub labels: Option<&'a [Vec<u32>]>,
}

/// What a batched forward returns: each prompt chunk's K/V, and the logits of every canvas
/// batch's unembedded positions as one float32 `[rows, vocab]` array — evaluated when a batch
/// asked for full rows, else only its device reductions are.
#[derive(Debug)]
pub struct ForwardOutput {
    pub chunks: Vec<ChunkKv>,
    pub(super) logits: Option<Array>,
    /// Per canvas batch: its device reduction when it gave labels.
    pub(super) reductions: Vec<Option<SlotReduction>>,
    /// Some canvas batch asked for full logits rows: `logits` is evaluated with the rest.
    pub(super) full_rows: bool,
    /// Per canvas batch: first row in `logits` and row count (canvases × positions).
    pub(super) rows: Vec<(usize, usize)>,
    pub(super) vocab: usize,
}

impl ForwardOutput {
    /// What evaluating this forward computes: every chunk's K/V, the device reductions, and the
    /// full logits only where a canvas batch asked for them.
    pub fn outputs(&self) -> Vec<&Array> {
        let mut out: Vec<&Array> = self
            .chunks
            .iter()
            .flat_map(|c| c.layers.iter().flat_map(|kv| [&kv.keys, &kv.values]))
            .collect();
        for reduction in self.reductions.iter().flatten() {
            out.extend(reduction.outputs());
        }
        if let (true, Some(logits)) = (self.full_rows, &self.logits) {
            out.push(logits);
        }
        out
    }

    /// The logits of canvas batch `i`, `[canvas][position][vocab]` flattened.
    pub fn logits(&self, i: usize) -> Result<&[f32], ModelError> {
        let (Some(&(start, count)), Some(all)) = (self.rows.get(i), self.logits.as_ref()) else {
            return Err(ModelError::Shape("no such canvas batch"));
        };
        let values = all
            .try_as_slice::<f32>()
            .map_err(|_| ModelError::Shape("logits are not contiguous float32"))?;
        values
            .get(start * self.vocab..(start + count) * self.vocab)
            .ok_or(ModelError::Shape("logits shorter than their rows"))
    }

    /// The whole logits array `[rows, vocab]` (rows of every canvas batch, in order).
    pub fn logits_array(&self) -> Option<&Array> {
        self.logits.as_ref()
    }

    /// The device-reduced slot rows of canvas batch `i` (one per canvas and position), for a
    /// batch that gave `labels`.
    pub fn slot_summaries(&self, i: usize) -> Result<Vec<SlotSummary>, ModelError> {
        self.reduction(i)?.summaries()
    }

    /// Row `row` of canvas batch `i` whole, copied from the device (the rare tie a summary
    /// cannot settle).
    pub fn full_row(&self, i: usize, row: usize) -> Result<Vec<f32>, ModelError> {
        self.reduction(i)?.full_row(row)
    }

    fn reduction(&self, i: usize) -> Result<&SlotReduction, ModelError> {
        self.reductions
            .get(i)
            .and_then(Option::as_ref)
            .ok_or(ModelError::Shape("canvas batch has no label reduction"))
    }
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
