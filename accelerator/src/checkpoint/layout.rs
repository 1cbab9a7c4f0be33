//! Find a checkpoint's layout from its tensors, validate every tensor its `config.json` implies,
//! and describe its weights per module as memory-mapped views, neutral to the array library:
//! a model loader turns a [`Weight`] into device arrays without copying.
//!
//! Nothing here depends on a tag a writer puts in the directory: the tensors are found through
//! [`weight_files`] (an index, any manifest that maps tensors to files, or the shards' own
//! headers), and the layout is the one whose tensors they are. NVFP4 is recognised by its expert
//! tensors (`.weight` U32, `.scales` U8, `.global_scale` per expert), affine by an affine
//! `quantization` block in config.json (which says how each module is stored), HF by dense
//! tensors. When none fits, the error names the closest layout, the first tensor in the
//! inventory's order that does not fit it, and what was expected (docs/checkpoint-layouts.md).
//!
//! Modules are keyed by the HF tensor name without a trailing `.weight` (e.g.
//! `model.decoder.layers.0.self_attn.q_proj`, `model.decoder.layers.0.experts.gate_up_proj`,
//! `model.decoder.layers.0.router.scale`), the same key in all three layouts.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::dims::{DimsError, ModelDims, TensorSpec};
use super::file_error::FileError;
use super::files::{weight_files, FilesError, MapSource};
use super::format::{
    affine_block, affine_storage, storage_for, stored_tensors, weight_name, Layout,
    QuantizationEntryError, Storage,
};
use super::tensors::{Dtype, PlannedTensor, TensorError, TensorSet, TensorView};

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{dir}: no checkpoint found ({why})")]
    NotACheckpoint { dir: PathBuf, why: String },
    #[error(transparent)]
    Dims(#[from] DimsError),
    #[error(transparent)]
    Tensor(#[from] TensorError),
    #[error(transparent)]
    Files(#[from] FilesError),
    #[error("{path}: {source}")]
    Quantization {
        path: PathBuf,
        source: QuantizationEntryError,
    },
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
    /// No layout fits: the closest one and the first tensor that does not fit it.
    #[error("{dir}: its tensors fit no checkpoint layout; closest is {closest} ({fitted} of {total} tensors fit), where {misfit}{hint}")]
    NoLayoutFits {
        dir: PathBuf,
        closest: Layout,
        fitted: usize,
        total: usize,
        /// A `Missing`, `Shape` or `Dtype` error for that tensor.
        misfit: Box<LayoutError>,
        /// Anything in config.json that explains it ("" when nothing does).
        hint: String,
    },
}

impl LayoutError {
    /// The error about one tensor: the misfit itself, or the misfit inside `NoLayoutFits`.
    pub fn misfit(&self) -> &LayoutError {
        match self {
            LayoutError::NoLayoutFits { misfit, .. } => misfit,
            other => other,
        }
    }
}

/// The JSON file at `path` (a checkpoint's `config.json`, its index or manifest).
pub(crate) fn read_json(path: &Path) -> Result<Value, FileError> {
    let text = std::fs::read_to_string(path).map_err(FileError::io(path))?;
    serde_json::from_str(&text).map_err(|e| FileError::json(path, e))
}

/// Which layout the checkpoint in `dir` holds (opens and validates it; see [`Checkpoint::open`]).
pub fn detect_layout(dir: &Path) -> Result<Layout, LayoutError> {
    Checkpoint::open(dir).map(|c| c.layout)
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
    Dense { tensor: String },
    Quantized(Quantized<String>),
}

/// What part of a module a stored tensor is (it decides the dtype the tensor is held in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// A dense float weight.
    Dense,
    /// Packed codes, or NVFP4's E4M3 block scales.
    Packed,
    /// An affine scale or bias.
    AffineScale,
    /// NVFP4's per-expert tensor scale.
    GlobalScale,
}

impl ModuleRef {
    /// Every tensor of the module with what part of it the tensor is.
    pub fn parts(&self) -> Vec<(&str, TensorKind)> {
        match self {
            ModuleRef::Dense { tensor } => vec![(tensor.as_str(), TensorKind::Dense)],
            ModuleRef::Quantized(q) => q
                .parts()
                .map(|(part, name)| (name.as_str(), part.kind(q.mode)))
                .collect(),
        }
    }
}

/// Which tensor of a quantised module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantizedPart {
    Codes,
    Scales,
    Biases,
    GlobalScale,
}

impl QuantizedPart {
    /// What kind of tensor this part is in a module encoded as `mode`.
    pub fn kind(self, mode: QuantMode) -> TensorKind {
        match (self, mode) {
            (QuantizedPart::Codes, _) | (QuantizedPart::Scales, QuantMode::Nvfp4) => {
                TensorKind::Packed
            }
            (QuantizedPart::Scales | QuantizedPart::Biases, _) => TensorKind::AffineScale,
            (QuantizedPart::GlobalScale, _) => TensorKind::GlobalScale,
        }
    }
}

/// The tensors of one quantised module and their encoding: the one list of a quantised module's
/// parts, whatever a tensor is held as: its name ([`ModuleRef`]), its view into the mapped files
/// ([`QuantizedWeight`]) or its loaded array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantized<T> {
    /// `uint32` packed codes, `[..., out, in·bits/32]`.
    pub codes: T,
    /// NVFP4: `uint8` E4M3 `[..., out, in/16]`; affine: float `[..., out, in/group]`.
    pub scales: T,
    /// Affine only.
    pub biases: Option<T>,
    /// NVFP4 experts: `f32 [E]`, absmax convention (`w = e2m1 · e4m3 · gs / 2688`).
    pub global_scale: Option<T>,
    pub mode: QuantMode,
}

impl<T> Quantized<T> {
    /// Every tensor present, with its part.
    pub fn parts(&self) -> impl Iterator<Item = (QuantizedPart, &T)> {
        [
            (QuantizedPart::Codes, Some(&self.codes)),
            (QuantizedPart::Scales, Some(&self.scales)),
            (QuantizedPart::Biases, self.biases.as_ref()),
            (QuantizedPart::GlobalScale, self.global_scale.as_ref()),
        ]
        .into_iter()
        .filter_map(|(part, t)| Some((part, t?)))
    }

    /// Each tensor turned into a `U` by `f`, which is told its part; the first error stops it.
    pub fn try_map<U, E>(
        &self,
        mut f: impl FnMut(QuantizedPart, &T) -> Result<U, E>,
    ) -> Result<Quantized<U>, E> {
        Ok(Quantized {
            codes: f(QuantizedPart::Codes, &self.codes)?,
            scales: f(QuantizedPart::Scales, &self.scales)?,
            biases: match &self.biases {
                Some(b) => Some(f(QuantizedPart::Biases, b)?),
                None => None,
            },
            global_scale: match &self.global_scale {
                Some(g) => Some(f(QuantizedPart::GlobalScale, g)?),
                None => None,
            },
            mode: self.mode,
        })
    }
}

/// A quantised weight as views into the mapped files.
pub type QuantizedWeight<'a> = Quantized<TensorView<'a>>;

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
    /// How the weight files were found.
    pub map_source: MapSource,
    pub config: Value,
    pub dims: ModelDims,
    tensors: TensorSet,
    modules: BTreeMap<String, ModuleRef>,
    /// Tensors present but not part of the text model (e.g. an HF vision tower).
    pub ignored: Vec<String>,
}

/// How well the tensors fit one layout.
struct Fit {
    modules: BTreeMap<String, ModuleRef>,
    used: HashSet<String>,
    fitted: usize,
    total: usize,
    /// The first tensor, in inventory order, that does not fit.
    first_misfit: Option<LayoutError>,
}

/// Float tensors may be stored in any float type; everything else exactly.
fn dtype_ok(expected: Dtype, actual: Dtype) -> bool {
    expected == actual || (expected.is_weight_float() && actual.is_weight_float())
}

/// Whether one expected tensor is there as expected, or the error that says how it is not.
fn check(tensors: &TensorSet, t: &PlannedTensor, expected_in: &str) -> Result<(), LayoutError> {
    let accepted = if t.dtype.is_weight_float() {
        "float".to_string()
    } else {
        t.dtype.to_string()
    };
    let missing = || LayoutError::Missing {
        tensor: t.name.clone(),
        expected: t.shape.clone(),
        dtype: accepted.clone(),
        expected_in: expected_in.to_string(),
    };
    let file = tensors.file_of(&t.name).ok_or_else(missing)?;
    let info = file.info(&t.name).ok_or_else(missing)?;
    if !dtype_ok(t.dtype, info.dtype) {
        let expected = if t.dtype.is_weight_float() {
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
    if info.shape != t.shape {
        return Err(LayoutError::Shape {
            tensor: t.name.clone(),
            file: file.path().to_path_buf(),
            expected: t.shape.clone(),
            actual: info.shape.clone(),
        });
    }
    Ok(())
}

/// The module reference for one inventory entry stored as `storage`.
fn module_ref(
    spec: &TensorSpec,
    layout: Layout,
    storage: Storage,
    outs: &[PlannedTensor],
) -> ModuleRef {
    let name = |i: usize| outs.get(i).map(|t| t.name.clone()).unwrap_or_default();
    match storage {
        Storage::Dense => ModuleRef::Dense {
            tensor: weight_name(spec, layout),
        },
        Storage::Nvfp4 => ModuleRef::Quantized(Quantized {
            codes: name(0),
            scales: name(1),
            biases: None,
            global_scale: Some(name(2)),
            mode: QuantMode::Nvfp4,
        }),
        Storage::Affine { group_size, bits } => ModuleRef::Quantized(Quantized {
            codes: name(0),
            scales: name(1),
            biases: Some(name(2)),
            global_scale: None,
            mode: QuantMode::Affine { group_size, bits },
        }),
    }
}

/// Measures how the tensors fit `layout`. Fails only when config.json's quantization block
/// itself is unusable (a fact about the config, not about the fit).
fn fit(
    tensors: &TensorSet,
    specs: &[TensorSpec],
    layout: Layout,
    config: &Value,
    cfg_path: &Path,
    expected_in: &str,
) -> Result<Fit, LayoutError> {
    let block = affine_block(config);
    let mut f = Fit {
        modules: BTreeMap::new(),
        used: HashSet::new(),
        fitted: 0,
        total: 0,
        first_misfit: None,
    };
    for spec in specs {
        let storage = match (layout, block) {
            (Layout::Hf, _) => Storage::Dense,
            (Layout::Nvfp4, _) => storage_for(spec, Layout::Nvfp4),
            (Layout::Affine, Some(q)) => {
                affine_storage(q, spec).map_err(|source| LayoutError::Quantization {
                    path: cfg_path.to_path_buf(),
                    source,
                })?
            }
            // Without a block there is nothing to say how each module is stored.
            (Layout::Affine, None) => storage_for(spec, Layout::Affine),
        };
        let outs = stored_tensors(spec, layout, storage, Dtype::BF16);
        for t in &outs {
            f.total += 1;
            match check(tensors, t, expected_in) {
                Ok(()) => {
                    f.fitted += 1;
                    f.used.insert(t.name.clone());
                }
                Err(e) => {
                    if f.first_misfit.is_none() {
                        f.first_misfit = Some(e);
                    }
                }
            }
        }
        f.modules.insert(
            spec.module().to_string(),
            module_ref(spec, layout, storage, &outs),
        );
    }
    Ok(f)
}

/// What in config.json may explain why no layout fits.
fn config_hint(config: &Value) -> String {
    let q = config
        .get("quantization_config")
        .or_else(|| config.get("quantization"));
    if let Some(method) = q
        .and_then(|q| q.get("quant_method"))
        .and_then(Value::as_str)
    {
        return format!(
            " (config.json's quantization_config names quant_method {method:?}, a layout Hunch \
             does not read; use the BF16, NVFP4-experts or MLX affine export)"
        );
    }
    if let Some(mode) = q.and_then(|q| q.get("mode")).and_then(Value::as_str) {
        if mode != "affine" && mode != "nvfp4" {
            return format!(" (config.json's quantization mode {mode:?} is not one Hunch reads)");
        }
    }
    String::new()
}

impl Checkpoint {
    /// Map the weight files of `dir`, find the layout its tensors fit and validate every tensor
    /// its `config.json` implies.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, LayoutError> {
        let dir = dir.as_ref();
        let cfg_path = dir.join("config.json");
        if !cfg_path.is_file() {
            return Err(LayoutError::NotACheckpoint {
                dir: dir.to_path_buf(),
                why: "no config.json".into(),
            });
        }
        Self::with_config(dir, read_json(&cfg_path)?)
    }

    /// [`Checkpoint::open`] with `dir`'s `config.json` already parsed (`config`): the loader
    /// parses it once for the model's [`Config`](crate::model::Config) and the inventory here.
    pub fn with_config(dir: impl AsRef<Path>, config: Value) -> Result<Self, LayoutError> {
        let dir = dir.as_ref().to_path_buf();
        let cfg_path = dir.join("config.json");
        let dims = ModelDims::from_config(&config)?;
        let files = weight_files(&dir)?;
        let tensors = TensorSet::open(&files.files)?;
        let expected_in = match &files.source {
            MapSource::Map(name) => name.to_string(),
            MapSource::Headers => files
                .files
                .iter()
                .filter_map(|f| f.file_name())
                .map(|f| f.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", "),
        };
        let specs = dims.tensors();
        let mut closest: Option<(Layout, Fit)> = None;
        for layout in Layout::ALL {
            if layout == Layout::Affine && affine_block(&config).is_none() {
                continue;
            }
            let f = fit(&tensors, &specs, layout, &config, &cfg_path, &expected_in)?;
            if f.first_misfit.is_none() {
                let ignored = tensors
                    .names()
                    .filter(|n| !f.used.contains(*n))
                    .map(str::to_string)
                    .collect();
                return Ok(Self {
                    dir,
                    layout,
                    map_source: files.source,
                    config,
                    dims,
                    tensors,
                    modules: f.modules,
                    ignored,
                });
            }
            // Layout::ALL is in order of preference: a later layout must fit strictly more.
            if closest.as_ref().is_none_or(|(_, c)| f.fitted > c.fitted) {
                closest = Some((layout, f));
            }
        }
        let Some((layout, f)) = closest else {
            return Err(LayoutError::NotACheckpoint {
                dir,
                why: "no layout to try".into(),
            });
        };
        Err(LayoutError::NoLayoutFits {
            dir,
            closest: layout,
            fitted: f.fitted,
            total: f.total,
            misfit: Box::new(f.first_misfit.unwrap_or(LayoutError::NotACheckpoint {
                dir: PathBuf::new(),
                why: "no misfit recorded".into(),
            })),
            hint: config_hint(&config),
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
        let get = |_, n: &String| self.tensors.get(n).ok_or(());
        match self.modules.get(module)? {
            ModuleRef::Dense { tensor } => self.tensors.get(tensor).map(Weight::Dense),
            ModuleRef::Quantized(q) => q.try_map(get).ok().map(Weight::Quantized),
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
