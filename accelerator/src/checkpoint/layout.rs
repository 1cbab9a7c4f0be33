//! Detect a checkpoint's layout, validate every expected tensor against its `config.json`, and
//! describe its weights per module as memory-mapped views, neutral to the array library:
//! a model loader turns a [`Weight`] into device arrays without copying.
//!
//! Modules are keyed by the HF tensor name without a trailing `.weight` (e.g.
//! `model.decoder.layers.0.self_attn.q_proj`, `model.decoder.layers.0.experts.gate_up_proj`,
//! `model.decoder.layers.0.router.scale`), the same key in all three layouts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::dims::{DimsError, ModelDims, Role, TensorSpec};
use super::tensors::{Dtype, TensorError, TensorSet, TensorView};
use super::writer::{
    self, outputs, weight_name, Layout, Storage, WriteError, MANIFEST, MANIFEST_FORMAT,
};

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    Json { path: PathBuf, why: String },
    #[error("{dir}: no checkpoint found ({why})")]
    NotACheckpoint { dir: PathBuf, why: String },
    #[error(transparent)]
    Dims(#[from] DimsError),
    #[error(transparent)]
    Tensor(#[from] TensorError),
    #[error("tensor {tensor} ({dtype} {expected:?}) is missing (expected in {expected_in})")]
    Missing {
        tensor: String,
        /// Shape implied by config.json, so the error says what to put there.
        expected: Vec<usize>,
        /// `U32`, `U8`, … or "float" where any float type is accepted.
        dtype: String,
        expected_in: String,
    },
    #[error("tensor {tensor} in {file}: shape {actual:?}, expected {expected:?} from config.json")]
    Shape {
        tensor: String,
        file: PathBuf,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("tensor {tensor} in {file}: dtype {actual}, expected {expected}")]
    Dtype {
        tensor: String,
        file: PathBuf,
        expected: String,
        actual: Dtype,
    },
    #[error("{path}: quantization entry for {module}: {why}")]
    Quantization {
        path: PathBuf,
        module: String,
        why: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LayoutError + '_ {
    move |source| LayoutError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn read_json(path: &Path) -> Result<Value, LayoutError> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    serde_json::from_str(&text).map_err(|e| LayoutError::Json {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

/// Which layout a folder holds: a `manifest.json` of ours means NVFP4, a `quantization` entry in
/// config.json means MLX affine, otherwise HF.
pub fn detect_layout(dir: &Path) -> Result<Layout, LayoutError> {
    let manifest = dir.join(MANIFEST);
    if manifest.is_file() {
        let m = read_json(&manifest)?;
        if m.get("format").and_then(Value::as_str) == Some(MANIFEST_FORMAT) {
            return Ok(Layout::Nvfp4);
        }
        return Err(LayoutError::Json {
            path: manifest,
            why: format!("\"format\" is not {MANIFEST_FORMAT:?}"),
        });
    }
    let cfg_path = dir.join("config.json");
    if !cfg_path.is_file() {
        return Err(LayoutError::NotACheckpoint {
            dir: dir.to_path_buf(),
            why: "no config.json".into(),
        });
    }
    let cfg = read_json(&cfg_path)?;
    // HF's own quantised checkpoints (ModelOpt, compressed-tensors …) name a quant_method in
    // quantization_config; only mlx_lm's block (no quant_method) is the affine layout.
    if let Some(method) = cfg
        .get("quantization_config")
        .and_then(|q| q.get("quant_method"))
        .and_then(Value::as_str)
    {
        return Err(LayoutError::Quantization {
            path: cfg_path,
            module: "(quantization_config)".into(),
            why: format!(
                "quant_method {method:?} is not supported; convert from the bf16 HF checkpoint"
            ),
        });
    }
    match cfg
        .get("quantization")
        .or_else(|| cfg.get("quantization_config"))
    {
        Some(q) => match q.get("mode").and_then(Value::as_str).unwrap_or("affine") {
            "affine" => Ok(Layout::Affine),
            other => Err(LayoutError::Quantization {
                path: cfg_path,
                module: "(default)".into(),
                why: format!("mode {other:?} is not supported (affine only)"),
            }),
        },
        None => Ok(Layout::Hf),
    }
}

/// How a quantised weight is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMode {
    /// E2M1 codes (8 per u32), E4M3 scales per 16 inputs, f32 per-expert global scale.
    Nvfp4,
    /// MLX affine: `w = scale · q + bias` per group.
    Affine { group_size: usize, bits: u32 },
}

/// Tensor names of one module, resolved against the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleRef {
    Dense {
        tensor: String,
    },
    Quantized {
        codes: String,
        scales: String,
        biases: Option<String>,
        global_scale: Option<String>,
        mode: QuantMode,
    },
}

/// A quantised weight as views into the mapped files.
#[derive(Debug, Clone, Copy)]
pub struct QuantizedWeight<'a> {
    /// `uint32` packed codes, `[..., out, in·bits/32]`.
    pub codes: TensorView<'a>,
    /// NVFP4: `uint8` E4M3 `[..., out, in/16]`; affine: float `[..., out, in/group]`.
    pub scales: TensorView<'a>,
    /// Affine only.
    pub biases: Option<TensorView<'a>>,
    /// NVFP4 experts: `f32 [E]`, absmax convention (`w = e2m1 · e4m3 · gs / 2688`).
    pub global_scale: Option<TensorView<'a>>,
    pub mode: QuantMode,
}

/// One module's weight.
#[derive(Debug, Clone, Copy)]
pub enum Weight<'a> {
    Dense(TensorView<'a>),
    Quantized(QuantizedWeight<'a>),
}

/// An opened, validated checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub layout: Layout,
    pub config: Value,
    pub dims: ModelDims,
    tensors: TensorSet,
    modules: BTreeMap<String, ModuleRef>,
    /// Tensors present but not part of the text model (e.g. an HF vision tower).
    pub ignored: Vec<String>,
}

/// Storage of a module in an affine checkpoint, from its `quantization` config.
fn affine_storage(q: &Value, spec: &TensorSpec, cfg_path: &Path) -> Result<Storage, LayoutError> {
    if spec.role == Role::Vector {
        return Ok(Storage::Dense);
    }
    let bad = |why: String| LayoutError::Quantization {
        path: cfg_path.to_path_buf(),
        module: spec.module().to_string(),
        why,
    };
    let get = |v: &Value, k: &str, dflt: Option<u64>| v.get(k).and_then(Value::as_u64).or(dflt);
    let dg = get(q, "group_size", Some(64));
    let db = get(q, "bits", Some(4));
    match q.get(spec.module()) {
        Some(Value::Bool(false)) => Ok(Storage::Dense),
        Some(Value::Bool(true)) | None => match (dg, db) {
            (Some(g), Some(b)) => Ok(Storage::Affine {
                group_size: g as usize,
                bits: b as u32,
            }),
            _ => Err(bad("no default group_size/bits".into())),
        },
        Some(o @ Value::Object(_)) => {
            if let Some(m) = o.get("mode").and_then(Value::as_str) {
                if m != "affine" {
                    return Err(bad(format!("mode {m:?} is not supported")));
                }
            }
            match (get(o, "group_size", dg), get(o, "bits", db)) {
                (Some(g), Some(b)) => Ok(Storage::Affine {
                    group_size: g as usize,
                    bits: b as u32,
                }),
                _ => Err(bad("needs group_size and bits".into())),
            }
        }
        Some(other) => Err(bad(format!("unexpected value {other}"))),
    }
}

fn dtype_ok(expected: Dtype, actual: Dtype) -> bool {
    let float = |d| matches!(d, Dtype::F32 | Dtype::F16 | Dtype::BF16);
    expected == actual || (float(expected) && float(actual))
}

impl Checkpoint {
    /// Detect the layout of `dir`, map its files and validate every tensor the config implies.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, LayoutError> {
        let dir = dir.as_ref().to_path_buf();
        let layout = detect_layout(&dir)?;
        let cfg_path = dir.join("config.json");
        let config = read_json(&cfg_path)?;
        let dims = ModelDims::from_config(&config)?;
        let files = match layout {
            Layout::Nvfp4 => {
                let m = read_json(&dir.join(MANIFEST))?;
                let mut f: Vec<String> = m
                    .get("weight_map")
                    .and_then(Value::as_object)
                    .map(|w| {
                        w.values()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                f.sort();
                f.dedup();
                f.into_iter().map(|n| dir.join(n)).collect()
            }
            _ => writer::hf_weight_files(&dir).map_err(|e| match e {
                WriteError::Io { path, source } => LayoutError::Io { path, source },
                other => LayoutError::NotACheckpoint {
                    dir: dir.clone(),
                    why: other.to_string(),
                },
            })?,
        };
        if files.is_empty() {
            return Err(LayoutError::NotACheckpoint {
                dir,
                why: "no weight files listed".into(),
            });
        }
        let tensors = TensorSet::open(&files)?;
        let where_ = match layout {
            Layout::Nvfp4 => MANIFEST.to_string(),
            _ => files
                .iter()
                .filter_map(|f| f.file_name())
                .map(|f| f.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", "),
        };
        let quant = config
            .get("quantization")
            .or_else(|| config.get("quantization_config"))
            .cloned();
        let mut modules = BTreeMap::new();
        let mut expected_names = std::collections::HashSet::new();
        for spec in dims.tensors() {
            let storage = match layout {
                Layout::Hf => Storage::Dense,
                Layout::Nvfp4 => writer::storage_for(&spec, Layout::Nvfp4),
                Layout::Affine => {
                    affine_storage(quant.as_ref().unwrap_or(&Value::Null), &spec, &cfg_path)?
                }
            };
            let outs = outputs(&spec, layout, storage, Dtype::BF16);
            for t in &outs {
                // Dense tensors, scales and biases may be any float type (see `dtype_ok`).
                let accepted = if matches!(t.dtype, Dtype::BF16 | Dtype::F32 | Dtype::F16) {
                    "float".to_string()
                } else {
                    t.dtype.to_string()
                };
                let file = tensors
                    .file_of(&t.name)
                    .ok_or_else(|| LayoutError::Missing {
                        tensor: t.name.clone(),
                        expected: t.shape.clone(),
                        dtype: accepted.clone(),
                        expected_in: where_.clone(),
                    })?;
                let info = file.info(&t.name).ok_or_else(|| LayoutError::Missing {
                    tensor: t.name.clone(),
                    expected: t.shape.clone(),
                    dtype: accepted.clone(),
                    expected_in: where_.clone(),
                })?;
                if info.shape != t.shape {
                    return Err(LayoutError::Shape {
                        tensor: t.name.clone(),
                        file: file.path().to_path_buf(),
                        expected: t.shape.clone(),
                        actual: info.shape.clone(),
                    });
                }
                if !dtype_ok(t.dtype, info.dtype) {
                    let expected = if matches!(t.dtype, Dtype::BF16 | Dtype::F32 | Dtype::F16) {
                        "a float type (BF16, F16, F32)".to_string()
                    } else {
                        t.dtype.to_string()
                    };
                    return Err(LayoutError::Dtype {
                        tensor: t.name.clone(),
                        file: file.path().to_path_buf(),
                        expected,
                        actual: info.dtype,
                    });
                }
                expected_names.insert(t.name.clone());
            }
            let name = |i: usize| outs.get(i).map(|t| t.name.clone()).unwrap_or_default();
            let r = match storage {
                Storage::Dense => ModuleRef::Dense {
                    tensor: weight_name(&spec, layout),
                },
                Storage::Nvfp4 => ModuleRef::Quantized {
                    codes: name(0),
                    scales: name(1),
                    biases: None,
                    global_scale: Some(name(2)),
                    mode: QuantMode::Nvfp4,
                },
                Storage::Affine { group_size, bits } => ModuleRef::Quantized {
                    codes: name(0),
                    scales: name(1),
                    biases: Some(name(2)),
                    global_scale: None,
                    mode: QuantMode::Affine { group_size, bits },
                },
            };
            modules.insert(spec.module().to_string(), r);
        }
        let ignored = tensors
            .names()
            .filter(|n| !expected_names.contains(*n))
            .map(str::to_string)
            .collect();
        Ok(Self {
            dir,
            layout,
            config,
            dims,
            tensors,
            modules,
            ignored,
        })
    }

    /// Module keys in sorted order.
    pub fn module_names(&self) -> impl Iterator<Item = &str> {
        self.modules.keys().map(String::as_str)
    }

    pub fn module_ref(&self, module: &str) -> Option<&ModuleRef> {
        self.modules.get(module)
    }

    /// The weight of a module as views into the mapping.
    pub fn weight(&self, module: &str) -> Option<Weight<'_>> {
        let get = |n: &str| self.tensors.get(n);
        match self.modules.get(module)? {
            ModuleRef::Dense { tensor } => get(tensor).map(Weight::Dense),
            ModuleRef::Quantized {
                codes,
                scales,
                biases,
                global_scale,
                mode,
            } => Some(Weight::Quantized(QuantizedWeight {
                codes: get(codes)?,
                scales: get(scales)?,
                biases: match biases {
                    Some(b) => Some(get(b)?),
                    None => None,
                },
                global_scale: match global_scale {
                    Some(g) => Some(get(g)?),
                    None => None,
                },
                mode: *mode,
            })),
        }
    }

    /// Every module with its weight.
    pub fn weights(&self) -> impl Iterator<Item = (&str, Weight<'_>)> {
        self.modules
            .keys()
            .filter_map(|k| self.weight(k).map(|w| (k.as_str(), w)))
    }

    /// The underlying mapped tensors.
    pub fn tensors(&self) -> &TensorSet {
        &self.tensors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::quant::{self, SourceDtype};
    use crate::checkpoint::random::DenseDtype;
    use crate::checkpoint::random::{Preset, RandomSpec};
    use crate::checkpoint::writer::{convert, convert_with, write_random_checkpoint};

    fn random(dir: &Path, layout: Layout, sets: &[&str]) -> RandomSpec {
        let mut spec = RandomSpec::new(Preset::Tiny, layout);
        spec.seed = 3;
        for s in sets {
            spec.set(s).expect("override");
        }
        write_random_checkpoint(dir, &spec).expect("write");
        spec
    }

    #[test]
    fn hf_round_trip_and_sharding() {
        let tmp = tempfile::tempdir().expect("tmp");
        let one = tmp.path().join("one");
        let mut spec = random(&one, Layout::Hf, &[]);
        let c = Checkpoint::open(&one).expect("open");
        assert_eq!(c.layout, Layout::Hf);
        assert_eq!(c.tensors().len(), 6 + 6 * 22 - 1 + 6);
        assert!(c.ignored.is_empty());
        assert!(
            matches!(c.weight("model.decoder.layers.0.experts.gate_up_proj"), Some(Weight::Dense(t)) if t.shape == [8, 128, 128])
        );
        assert!(c
            .module_ref("model.decoder.layers.5.self_attn.v_proj")
            .is_none());
        assert!(crate::tokenizer::Tokenizer::from_dir(&one).is_ok());

        let sharded = tmp.path().join("sharded");
        spec.max_shard_bytes = 1 << 20;
        write_random_checkpoint(&sharded, &spec).expect("write sharded");
        assert!(sharded.join("model.safetensors.index.json").is_file());
        let s = Checkpoint::open(&sharded).expect("open sharded");
        assert!(s.tensors().files().len() > 2);
        // same seed, same values, whatever the sharding
        for (name, w) in c.weights() {
            let (Weight::Dense(a), Some(Weight::Dense(b))) = (w, s.weight(name)) else {
                panic!("{name}")
            };
            assert_eq!(a.bytes, b.bytes, "{name}");
        }
    }

    #[test]
    fn nvfp4_random_equals_converted_hf_and_dequantises_close() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (hf, q, conv) = (
            tmp.path().join("hf"),
            tmp.path().join("q"),
            tmp.path().join("conv"),
        );
        random(&hf, Layout::Hf, &[]);
        random(&q, Layout::Nvfp4, &[]);
        convert(&hf, &conv, Layout::Nvfp4).expect("convert");
        let a = std::fs::read(q.join("model.safetensors")).expect("read");
        let b = std::fs::read(conv.join("model.safetensors")).expect("read");
        assert!(a == b, "random nvfp4 and convert(random hf) differ");
        let manifest = read_json(&q.join(MANIFEST)).expect("manifest");
        assert_eq!(
            manifest["weight_map"]["model.decoder.layers.0.experts.down_proj.scales"],
            "model.safetensors"
        );
        assert!(read_json(&q.join("config.json"))
            .expect("cfg")
            .get("vision_config")
            .is_none());

        let c = Checkpoint::open(&q).expect("open");
        let h = Checkpoint::open(&hf).expect("open hf");
        assert_eq!(c.layout, Layout::Nvfp4);
        let m = "model.decoder.layers.2.experts.down_proj";
        let Some(Weight::Quantized(w)) = c.weight(m) else {
            panic!("not quantised")
        };
        assert_eq!(w.mode, QuantMode::Nvfp4);
        assert_eq!(
            (w.codes.shape, w.scales.shape),
            (&[8, 128, 8][..], &[8, 128, 4][..])
        );
        let gs = w.global_scale.expect("gs").to_f32().expect("f32");
        let Some(Weight::Dense(orig)) = h.weight(m) else {
            panic!("hf")
        };
        let orig = orig.to_f32().expect("f32");
        let codes = w.codes.to_u32().expect("u32");
        let per = orig.len() / 8;
        for e in 0..8 {
            // the per-expert global scale is the expert's absmax
            let amax = orig[e * per..(e + 1) * per]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(gs[e], amax);
            let q = quant::Nvfp4 {
                codes: codes[e * per / 8..(e + 1) * per / 8].to_vec(),
                scales: w.scales.bytes[e * per / 16..(e + 1) * per / 16].to_vec(),
            };
            let d = quant::dequantize_nvfp4(&q, Some(gs[e]));
            let err = d
                .iter()
                .zip(&orig[e * per..])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                err <= amax / 6.0 * 1.01,
                "expert {e}: max error {err}, absmax {amax}"
            );
        }
        // dense tensors are copied as bf16
        let Some(Weight::Dense(n)) = c.weight("model.decoder.layers.0.input_layernorm") else {
            panic!()
        };
        assert_eq!(n.dtype, Dtype::BF16);
    }

    #[test]
    fn affine_layout_follows_mlx_conventions() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (hf, q) = (tmp.path().join("hf"), tmp.path().join("q"));
        random(&hf, Layout::Hf, &[]);
        random(&q, Layout::Affine, &[]);
        let cfg = read_json(&q.join("config.json")).expect("cfg");
        let qc = &cfg["quantization"];
        assert_eq!(
            (
                qc["group_size"].as_u64(),
                qc["bits"].as_u64(),
                qc["mode"].as_str()
            ),
            (Some(64), Some(4), Some("affine"))
        );
        assert_eq!(qc["model.decoder.embed_tokens"]["bits"], 8);
        assert_eq!(qc["model.decoder.layers.0.router.proj"]["bits"], 8);
        assert!(
            qc.get("model.decoder.layers.0.experts.gate_up_proj")
                .is_none(),
            "experts take the default"
        );
        assert_eq!(cfg["quantization_config"], *qc);
        let c = Checkpoint::open(&q).expect("open");
        assert_eq!(c.layout, Layout::Affine);
        let h = Checkpoint::open(&hf).expect("hf");
        for (m, bits) in [
            ("model.decoder.layers.1.self_attn.q_proj", 8),
            ("model.decoder.layers.1.experts.gate_up_proj", 4),
        ] {
            let Some(Weight::Quantized(w)) = c.weight(m) else {
                panic!("{m}")
            };
            assert_eq!(
                w.mode,
                QuantMode::Affine {
                    group_size: 64,
                    bits
                }
            );
            assert_eq!(w.codes.name, format!("{m}.weight"));
            let Some(Weight::Dense(o)) = h.weight(m) else {
                panic!("{m}")
            };
            let o = o.to_f32().expect("f32");
            let a = quant::Affine {
                codes: w.codes.to_u32().expect("u32"),
                scales: w.scales.to_f32().expect("f32"),
                biases: w.biases.expect("biases").to_f32().expect("f32"),
                bits,
                group_size: 64,
            };
            let d = quant::dequantize_affine(&a, SourceDtype::Bf16);
            let rms = (o.iter().map(|x| x * x).sum::<f32>() / o.len() as f32).sqrt();
            let err = d
                .iter()
                .zip(&o)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                err < rms * if bits == 8 { 0.05 } else { 0.6 },
                "{m}: {err} vs rms {rms}"
            );
        }
    }

    #[test]
    fn validation_names_tensor_file_and_shapes() {
        let tmp = tempfile::tempdir().expect("tmp");
        let d = tmp.path().join("q");
        random(&d, Layout::Nvfp4, &[]);
        // claim a different hidden size: the first tensor read must fail with both shapes
        let cfg_path = d.join("config.json");
        let mut cfg = read_json(&cfg_path).expect("cfg");
        cfg["text_config"]["vocab_size"] = 4096.into();
        std::fs::write(&cfg_path, cfg.to_string()).expect("write");
        let e = Checkpoint::open(&d).expect_err("must fail");
        let msg = e.to_string();
        assert!(matches!(e, LayoutError::Shape { .. }), "{msg}");
        assert!(
            msg.contains("model.decoder.embed_tokens.weight")
                && msg.contains("model.safetensors")
                && msg.contains("[4096, 128]")
                && msg.contains("[2048, 128]"),
            "{msg}"
        );
        // a tensor missing from the manifest's files
        cfg["text_config"]["vocab_size"] = 2048.into();
        cfg["text_config"]["num_hidden_layers"] = 7.into();
        cfg["text_config"]["layer_types"] =
            serde_json::json!(crate::checkpoint::dims::layer_types_for(7));
        std::fs::write(&cfg_path, cfg.to_string()).expect("write");
        let msg = Checkpoint::open(&d).expect_err("must fail").to_string();
        assert!(
            msg.contains("model.decoder.layers.6.") && msg.contains("missing"),
            "{msg}"
        );
        assert!(Checkpoint::open(tmp.path()).is_err());
    }

    #[test]
    fn odd_dims_stay_dense_in_affine_and_f32_is_kept() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (hf, q) = (tmp.path().join("hf"), tmp.path().join("q"));
        // the reference tiny model's expert width (32) is not a multiple of 64
        random(
            &hf,
            Layout::Hf,
            &["moe_intermediate_size=32", "hidden_size=64"],
        );
        convert_with(&hf, &q, Layout::Affine, DenseDtype::F32, 1 << 30).expect("convert");
        let c = Checkpoint::open(&q).expect("open");
        assert_eq!(
            c.config["quantization"]["model.decoder.layers.0.experts.down_proj"],
            false
        );
        assert!(matches!(
            c.weight("model.decoder.layers.0.experts.down_proj"),
            Some(Weight::Dense(_))
        ));
        let Some(Weight::Quantized(g)) = c.weight("model.decoder.layers.0.experts.gate_up_proj")
        else {
            panic!()
        };
        assert_eq!(g.scales.dtype, Dtype::F32);
        assert_eq!(c.config["dtype"], "float32");
    }

    /// The transformers-written reference checkpoint (f32, with a vision tower; kept in the
    /// repository under `accelerator/tests/data/tiny-hf`) converts and validates.
    #[test]
    fn converts_the_transformers_reference_checkpoint() {
        let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-hf"));
        let h = Checkpoint::open(src).expect("open reference");
        assert_eq!(h.ignored.len(), 16, "vision tensors");
        let tmp = tempfile::tempdir().expect("tmp");
        for layout in [Layout::Nvfp4, Layout::Affine] {
            let out = tmp.path().join(layout.to_string());
            convert(src, &out, layout).expect("convert");
            let c = Checkpoint::open(&out).expect("open converted");
            assert!(c.ignored.is_empty());
        }
    }

    #[test]
    fn hf_quantised_configs_are_refused_by_name() {
        let tmp = tempfile::tempdir().expect("tmp");
        let d = tmp.path().join("hf");
        random(&d, Layout::Hf, &[]);
        assert_eq!(detect_layout(&d).expect("detect"), Layout::Hf);
        let cfg_path = d.join("config.json");
        let mut cfg = read_json(&cfg_path).expect("cfg");
        cfg["quantization_config"] = serde_json::json!({"quant_method": "modelopt"});
        std::fs::write(&cfg_path, cfg.to_string()).expect("write");
        let msg = detect_layout(&d).expect_err("refused").to_string();
        assert!(msg.contains("\"modelopt\""), "{msg}");
    }
}
