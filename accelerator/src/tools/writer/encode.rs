//! Turning a tensor's f32 values into the bytes a layout stores (dense floats, NVFP4 or affine
//! codes with their scales), and batching that work across threads.

use super::stream::{bf16_bytes, f32_bytes, u32_bytes};
use super::WriteError;
use crate::checkpoint::dims::TensorSpec;
use crate::checkpoint::format::Storage;
use crate::checkpoint::tensors::Dtype;
use crate::tools::quant::{self, SourceDtype};

fn float_bytes(v: &[f32], d: Dtype) -> Vec<u8> {
    match d {
        Dtype::F32 => f32_bytes(v),
        _ => bf16_bytes(v),
    }
}

/// Produce the bytes of every output of one entry from its values (already in the dense dtype).
pub(super) fn encode(
    spec: &TensorSpec,
    values: &[f32],
    storage: Storage,
    dense: Dtype,
) -> Result<Vec<Vec<u8>>, WriteError> {
    let src = if dense == Dtype::F32 {
        SourceDtype::F32
    } else {
        SourceDtype::Bf16
    };
    let cols = spec.shape.last().copied().unwrap_or(0);
    let qerr = |source| WriteError::Quant {
        name: spec.name.clone(),
        source,
    };
    Ok(match storage {
        Storage::Dense => vec![float_bytes(values, dense)],
        Storage::Nvfp4 => {
            // One global scale per expert: its absmax, as mlx_lm quantises a stacked switch
            // layer one expert at a time (MLX's global_scale must be a scalar per call).
            let experts = spec.shape[0];
            let per = values.len() / experts.max(1);
            let (mut codes, mut scales, mut gs) = (Vec::new(), Vec::new(), Vec::new());
            for e in values.chunks_exact(per.max(1)) {
                let amax = e.iter().fold(0f32, |m, v| m.max(v.abs()));
                // An all-zero expert would divide by zero; any scale gives the same zero codes.
                let g = if amax > 0.0 { amax } else { 1.0 };
                let q = quant::quantize_nvfp4(e, cols, src, Some(g)).map_err(qerr)?;
                codes.extend(q.codes);
                scales.extend(q.scales);
                gs.push(g);
            }
            vec![u32_bytes(&codes), scales, f32_bytes(&gs)]
        }
        Storage::Affine { group_size, bits } => {
            let q = quant::quantize_affine(values, cols, group_size, bits, src).map_err(qerr)?;
            vec![
                u32_bytes(&q.codes),
                float_bytes(&q.scales, dense),
                float_bytes(&q.biases, dense),
            ]
        }
    })
}

/// Split a shard's members into batches of at most `threads` tensors and about 1 GiB of f32
/// values, so a full-size checkpoint does not hold several expert stacks at once.
pub(super) fn batches(members: &[usize], specs: &[TensorSpec], threads: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut bytes = 0usize;
    for &i in members {
        let b = specs[i].numel() * 4;
        if !cur.is_empty() && (cur.len() >= threads || bytes + b > 1 << 30) {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        cur.push(i);
        bytes += b;
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}
