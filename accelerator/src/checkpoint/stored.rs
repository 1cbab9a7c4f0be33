//! How a checkpoint's matrices are stored, summarised for people: the model's `kind` in
//! `/health` (and so `/v1/models`' `x_quantization`) says it, so an operator sees which file
//! answers without opening it. Read from the tensors themselves (their types, and the
//! `.scales` beside packed codes), never from a file name.

use std::path::Path;

use hunch_core::protocol::ModelKind;
use serde_json::Value;

use super::format::{affine_block, Layout};
use super::gguf::GgufFile;
use super::layout::Checkpoint;
use super::tensors::TensorSet;

/// A DiffusionGemma checkpoint directory's kind (answering with the read named `read`): its
/// layout as detection found it (the
/// tensors of an open [`Checkpoint`]) and its matrices' storage. Only headers are read.
pub fn diffusion_kind(dir: &Path, read: &str) -> ModelKind {
    let (layout, quantization) = match Checkpoint::open(dir) {
        Ok(checkpoint) => {
            let packed = (checkpoint.layout == Layout::Nvfp4).then_some("nvfp4");
            let quantization = super::files::weight_files(dir)
                .ok()
                .and_then(|files| TensorSet::open(&files.files).ok())
                .map(|tensors| safetensors(&tensors, &checkpoint.config, packed))
                .unwrap_or_else(|| "unknown".into());
            let layout = match checkpoint.layout {
                Layout::Affine => "mlx-affine".to_string(),
                other => other.to_string(),
            };
            (layout, quantization)
        }
        // The model loaded, so this cannot fail short of the files changing under it.
        Err(_) => ("unknown".into(), "unknown".into()),
    };
    ModelKind {
        family: "diffusion-gemma".into(),
        architecture: "diffusiongemma".into(),
        layout,
        quantization,
        read: read.into(),
        decision_type: None,
        name: None,
        ignored_config_keys: Vec::new(),
    }
}

/// A chat model's kind (answering with the read named `read`): `architecture` as the loader
/// found it, the layout (`gguf`; `hf`, or
/// `mlx-affine` when its matrices are affine codes) and the storage, and for a GGUF the name
/// the file gives itself (`general.name`).
pub fn chat_kind(
    path: &Path,
    format: &super::causal::CausalFormat,
    architecture: &str,
    read: &str,
) -> ModelKind {
    use super::causal::CausalFormat;
    let (layout, quantization, name) = match format {
        CausalFormat::Gguf => match GgufFile::open(path) {
            Ok(file) => (
                "gguf".to_string(),
                gguf(&file),
                file.string("general.name").map(str::to_string),
            ),
            Err(_) => ("gguf".to_string(), "unknown".to_string(), None),
        },
        CausalFormat::HuggingFace { .. } => {
            let config = super::layout::read_json(&path.join("config.json")).unwrap_or_default();
            let quantization = super::files::weight_files(path)
                .ok()
                .and_then(|files| TensorSet::open(&files.files).ok())
                .map(|tensors| safetensors(&tensors, &config, None))
                .unwrap_or_else(|| "unknown".into());
            let layout = if quantization.starts_with("affine") {
                "mlx-affine"
            } else {
                "hf"
            };
            (layout.to_string(), quantization, None)
        }
    };
    ModelKind {
        // A decision model (read `decision`) is a causal model of the same families trained
        // for the contract; its own family name keeps it apart from a chat model in listings.
        family: if read == "decision" {
            "decision"
        } else {
            "chat"
        }
        .into(),
        architecture: architecture.into(),
        layout,
        quantization,
        read: read.into(),
        decision_type: None,
        name,
        ignored_config_keys: Vec::new(),
    }
}

/// The storage types of a checkpoint's matrices (tensors of two or more dimensions; norms and
/// biases are float whatever the quantisation), the one holding the most weights first, ties
/// by name, joined by `+`: `Q4_1+Q8_0`, `BF16`, `affine-4bit-g64+BF16`. `unknown` when there
/// are none.
pub fn summarize<I: IntoIterator<Item = (String, u64)>>(matrices: I) -> String {
    let mut by_type: Vec<(String, u64)> = Vec::new();
    for (ty, weights) in matrices {
        match by_type.iter_mut().find(|(t, _)| *t == ty) {
            Some(entry) => entry.1 += weights,
            None => by_type.push((ty, weights)),
        }
    }
    if by_type.is_empty() {
        return "unknown".into();
    }
    by_type.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    by_type
        .into_iter()
        .map(|(ty, _)| ty)
        .collect::<Vec<_>>()
        .join("+")
}

/// A GGUF file's matrices by their ggml type (`Q4_1`, `Q8_0`, `F16`, …).
pub fn gguf(file: &GgufFile) -> String {
    summarize(
        file.tensors()
            .filter(|t| t.dims.len() >= 2)
            .map(|t| (t.ggml_type.to_string(), t.elements())),
    )
}

/// A safetensors checkpoint's matrices: float ones by dtype (`BF16`, `F16`, `F32`); packed
/// codes with `.scales` beside them as MLX affine (bits and group size from `config`'s
/// `quantization` block when it has one, else just `affine`); other packed codes as
/// `packed` names them (a layout that knows its codes, e.g. `nvfp4`), or by their dtype.
/// A packed weight counts the weights it holds (codes × 32 / bits), so a 4-bit model reads as
/// 4-bit first even though its float embedding takes more bytes per weight.
pub fn safetensors(tensors: &TensorSet, config: &Value, packed: Option<&str>) -> String {
    let affine = affine_block(config)
        .map(|q| {
            let bits = q.get("bits").and_then(Value::as_u64).unwrap_or(4);
            let group = q.get("group_size").and_then(Value::as_u64).unwrap_or(64);
            (bits, group)
        })
        .or_else(|| affine_from_embedding(tensors, config))
        .map(|(bits, group)| (format!("affine-{bits}bit-g{group}"), bits));
    let matrices = tensors.names().filter_map(|name| {
        let info = tensors.file_of(name)?.info(name)?;
        if info.shape.len() < 2 || name.ends_with(".scales") || name.ends_with(".biases") {
            return None;
        }
        let elements = info.shape.iter().product::<usize>() as u64;
        if info.dtype.is_weight_float() {
            return Some((info.dtype.name().to_string(), elements));
        }
        let base = name.strip_suffix(".weight").unwrap_or(name);
        let per_element_bits = 8 * info.dtype.size() as u64;
        if tensors.contains(&format!("{base}.scales")) {
            return Some(match &affine {
                Some((label, bits)) => (label.clone(), elements * per_element_bits / bits),
                None => ("affine".to_string(), elements),
            });
        }
        Some(match packed {
            // NVFP4 codes are 4 bits each.
            Some(label) => (label.to_string(), elements * per_element_bits / 4),
            None => (info.dtype.name().to_string(), elements),
        })
    });
    summarize(matrices)
}

/// Bits and group size from the embedding's shapes, for a converter that wrote no
/// `quantization` block: its input width is the config's `hidden_size` (a multimodal config's
/// `text_config`), its codes `[vocab, hidden·bits/32]` and its scales `[vocab, hidden/group]`.
fn affine_from_embedding(tensors: &TensorSet, config: &Value) -> Option<(u64, u64)> {
    let hidden = config
        .get("text_config")
        .unwrap_or(config)
        .get("hidden_size")
        .and_then(Value::as_u64)?;
    let codes = tensors
        .names()
        .find(|n| n.ends_with("embed_tokens.weight") || n.ends_with("embed_tokens"))?;
    let base = codes.strip_suffix(".weight").unwrap_or(codes);
    let scales = format!("{base}.scales");
    let width = |name: &str| -> Option<u64> {
        let info = tensors.file_of(name)?.info(name)?;
        info.shape.last().map(|&w| w as u64)
    };
    let (packed, groups) = (width(codes)?, width(&scales)?);
    let bits = packed * 32 / hidden.max(1);
    let group = hidden / groups.max(1);
    (bits * hidden == packed * 32 && group * groups == hidden).then_some((bits, group))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_type_holding_most_weights_comes_first() {
        let summary = summarize([
            ("Q8_0".to_string(), 28_000_000),
            ("Q4_1".to_string(), 50_000_000),
            ("Q4_1".to_string(), 50_000_000),
            ("F32".to_string(), 10),
        ]);
        assert_eq!(summary, "Q4_1+Q8_0+F32");
        assert_eq!(summarize([("BF16".to_string(), 1)]), "BF16");
        assert_eq!(summarize(Vec::new()), "unknown");
    }
}
