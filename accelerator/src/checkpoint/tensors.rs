//! Memory-mapped safetensors files and a streaming safetensors writer.
//!
//! The reader hands out [`TensorView`]s that borrow the mapping: a loader turns them into device
//! arrays without an intermediate copy. The header is parsed here (it is an 8-byte little-endian
//! length and a JSON object) so errors can name the file and the tensor.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

/// Element types that occur in the three layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dtype {
    F32,
    F16,
    BF16,
    U32,
    U8,
    I32,
    I64,
    BOOL,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 | Dtype::U32 | Dtype::I32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            Dtype::U8 | Dtype::BOOL => 1,
            Dtype::I64 => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::U32 => "U32",
            Dtype::U8 => "U8",
            Dtype::I32 => "I32",
            Dtype::I64 => "I64",
            Dtype::BOOL => "BOOL",
        }
    }

    fn parse(s: &str) -> Option<Dtype> {
        Some(match s {
            "F32" => Dtype::F32,
            "F16" => Dtype::F16,
            "BF16" => Dtype::BF16,
            "U32" => Dtype::U32,
            "U8" => Dtype::U8,
            "I32" => Dtype::I32,
            "I64" => Dtype::I64,
            "BOOL" => Dtype::BOOL,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a safetensors file: {why}")]
    BadHeader { path: PathBuf, why: String },
    #[error("{path}: tensor {name}: {why}")]
    BadTensor {
        path: PathBuf,
        name: String,
        why: String,
    },
    #[error("tensor {name} not found in {path}")]
    Missing { path: PathBuf, name: String },
    #[error("tensor {name}: cannot read dtype {dtype} as {wanted}")]
    WrongDtype {
        name: String,
        dtype: Dtype,
        wanted: &'static str,
    },
    #[error("writing {path}: tensor {name}: {why}")]
    Write {
        path: PathBuf,
        name: String,
        why: String,
    },
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TensorError + '_ {
    move |source| TensorError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where one tensor lives inside a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range inside the file (absolute, header included).
    pub start: usize,
    pub end: usize,
}

/// A borrowed view of one tensor's raw little-endian bytes inside a mapping.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl TensorView<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Widen a float tensor to f32 (copies; for tests, conversion and quantisation).
    pub fn to_f32(&self) -> Result<Vec<f32>, TensorError> {
        let b = self.bytes;
        Ok(match self.dtype {
            Dtype::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            Dtype::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            d => {
                return Err(TensorError::WrongDtype {
                    name: self.name.to_string(),
                    dtype: d,
                    wanted: "a float type",
                })
            }
        })
    }

    pub fn to_u32(&self) -> Result<Vec<u32>, TensorError> {
        if self.dtype != Dtype::U32 {
            return Err(TensorError::WrongDtype {
                name: self.name.to_string(),
                dtype: self.dtype,
                wanted: "U32",
            });
        }
        Ok(self
            .bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// One memory-mapped safetensors file.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    mmap: Mmap,
    tensors: BTreeMap<String, TensorInfo>,
    metadata: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

impl SafetensorsFile {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TensorError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(io_err(&path))?;
        // SAFETY: the mapping is read-only; checkpoints are not modified while a server runs
        // (the same assumption every safetensors loader makes).
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_err(&path))?;
        let bad = |why: String| TensorError::BadHeader {
            path: path.clone(),
            why,
        };
        if mmap.len() < 8 {
            return Err(bad(format!(
                "{} bytes, shorter than the 8-byte header length",
                mmap.len()
            )));
        }
        let mut len8 = [0u8; 8];
        len8.copy_from_slice(&mmap[..8]);
        let hlen = u64::from_le_bytes(len8) as usize;
        let data_start = hlen
            .checked_add(8)
            .filter(|&e| e <= mmap.len())
            .ok_or_else(|| {
                bad(format!(
                    "header length {hlen} exceeds the file size {}",
                    mmap.len()
                ))
            })?;
        let header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&mmap[8..data_start]).map_err(|e| bad(e.to_string()))?;
        let mut tensors = BTreeMap::new();
        let mut metadata = BTreeMap::new();
        for (name, v) in header {
            if name == "__metadata__" {
                if let Some(m) = v.as_object() {
                    for (k, v) in m {
                        metadata.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
                    }
                }
                continue;
            }
            let bad_t = |why: String| TensorError::BadTensor {
                path: path.clone(),
                name: name.clone(),
                why,
            };
            let raw: RawEntry = serde_json::from_value(v).map_err(|e| bad_t(e.to_string()))?;
            let dtype = Dtype::parse(&raw.dtype)
                .ok_or_else(|| bad_t(format!("unsupported dtype {}", raw.dtype)))?;
            let [a, b] = raw.data_offsets;
            let numel: usize = raw.shape.iter().product();
            if b < a || b - a != numel * dtype.size() {
                return Err(bad_t(format!(
                    "data_offsets {a}..{b} do not hold {numel} × {dtype} for shape {:?}",
                    raw.shape
                )));
            }
            if data_start + b > mmap.len() {
                return Err(bad_t(format!(
                    "data ends past the end of the file ({a}..{b})"
                )));
            }
            tensors.insert(
                name,
                TensorInfo {
                    dtype,
                    shape: raw.shape,
                    start: data_start + a,
                    end: data_start + b,
                },
            );
        }
        Ok(Self {
            path,
            mmap,
            tensors,
            metadata,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, TensorError> {
        let (key, info) = self
            .tensors
            .get_key_value(name)
            .ok_or_else(|| TensorError::Missing {
                path: self.path.clone(),
                name: name.to_string(),
            })?;
        Ok(TensorView {
            name: key,
            dtype: info.dtype,
            shape: &info.shape,
            bytes: &self.mmap[info.start..info.end],
        })
    }
}

/// All tensors of a checkpoint across its shard files, by name.
#[derive(Debug, Default)]
pub struct TensorSet {
    files: Vec<SafetensorsFile>,
    index: BTreeMap<String, usize>,
}

impl TensorSet {
    /// Map the given files; a tensor name present in two files is an error.
    pub fn open(paths: &[PathBuf]) -> Result<Self, TensorError> {
        let mut set = TensorSet::default();
        for p in paths {
            let f = SafetensorsFile::open(p)?;
            let i = set.files.len();
            for n in f.names() {
                if let Some(&j) = set.index.get(n) {
                    return Err(TensorError::BadTensor {
                        path: p.clone(),
                        name: n.to_string(),
                        why: format!("also stored in {}", set.files[j].path.display()),
                    });
                }
                set.index.insert(n.to_string(), i);
            }
            set.files.push(f);
        }
        Ok(set)
    }

    pub fn files(&self) -> &[SafetensorsFile] {
        &self.files
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The file that holds `name`.
    pub fn file_of(&self, name: &str) -> Option<&SafetensorsFile> {
        self.index.get(name).map(|&i| &self.files[i])
    }

    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        self.file_of(name).and_then(|f| f.tensor(name).ok())
    }
}

/// One planned tensor of a file being written.
#[derive(Debug, Clone)]
pub struct PlannedTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl PlannedTensor {
    pub fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// Streams a safetensors file: the header is written from the plan first, then each tensor's
/// bytes in plan order, so a multi-gigabyte file never has to be held in memory.
pub struct SafetensorsWriter {
    path: PathBuf,
    out: BufWriter<File>,
    plan: Vec<PlannedTensor>,
    next: usize,
}

impl SafetensorsWriter {
    pub fn create(
        path: impl AsRef<Path>,
        plan: Vec<PlannedTensor>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Self, TensorError> {
        let path = path.as_ref().to_path_buf();
        let mut header = serde_json::Map::new();
        if !metadata.is_empty() {
            header.insert(
                "__metadata__".into(),
                serde_json::to_value(metadata).unwrap_or_default(),
            );
        }
        let mut off = 0usize;
        for t in &plan {
            let n = t.nbytes();
            header.insert(
                t.name.clone(),
                serde_json::json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [off, off + n]}),
            );
            off += n;
        }
        let mut hb = serde_json::to_vec(&header).map_err(|e| TensorError::Write {
            path: path.clone(),
            name: String::new(),
            why: e.to_string(),
        })?;
        // Pad the header with spaces so tensor data starts 8-byte aligned (as the Python writer does).
        while hb.len() % 8 != 0 {
            hb.push(b' ');
        }
        let file = File::create(&path).map_err(io_err(&path))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&(hb.len() as u64).to_le_bytes())
            .map_err(io_err(&path))?;
        out.write_all(&hb).map_err(io_err(&path))?;
        Ok(Self {
            path,
            out,
            plan,
            next: 0,
        })
    }

    /// Name of the tensor expected next, if any.
    pub fn next_name(&self) -> Option<&str> {
        self.plan.get(self.next).map(|t| t.name.as_str())
    }

    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<(), TensorError> {
        let t = self.plan.get(self.next).ok_or_else(|| TensorError::Write {
            path: self.path.clone(),
            name: name.to_string(),
            why: "not in the plan".into(),
        })?;
        if t.name != name || t.nbytes() != bytes.len() {
            return Err(TensorError::Write {
                path: self.path.clone(),
                name: name.to_string(),
                why: format!(
                    "expected {} with {} bytes next, got {} bytes",
                    t.name,
                    t.nbytes(),
                    bytes.len()
                ),
            });
        }
        self.out.write_all(bytes).map_err(io_err(&self.path))?;
        self.next += 1;
        Ok(())
    }

    pub fn finish(mut self) -> Result<(), TensorError> {
        if let Some(t) = self.plan.get(self.next) {
            return Err(TensorError::Write {
                path: self.path.clone(),
                name: t.name.clone(),
                why: "file closed before this tensor was written".into(),
            });
        }
        self.out.flush().map_err(io_err(&self.path))
    }
}

/// Little-endian bytes of f32 values.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes of f32 values rounded to bf16 (nearest, ties to even).
pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes())
        .collect()
}

pub fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_map() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("a.safetensors");
        let plan = vec![
            PlannedTensor {
                name: "x".into(),
                dtype: Dtype::BF16,
                shape: vec![2, 3],
            },
            PlannedTensor {
                name: "c".into(),
                dtype: Dtype::U32,
                shape: vec![1],
            },
        ];
        let mut w = SafetensorsWriter::create(&p, plan, &BTreeMap::new()).expect("create");
        assert!(w.write("c", &[0; 4]).is_err(), "out of order");
        w.write("x", &bf16_bytes(&[1.0, -2.0, 0.5, 3.0, 0.0, 1.5]))
            .expect("x");
        w.write("c", &u32_bytes(&[0xDEADBEEF])).expect("c");
        w.finish().expect("finish");
        let set = TensorSet::open(&[p]).expect("open");
        let x = set.get("x").expect("x");
        assert_eq!(x.shape, &[2, 3]);
        assert_eq!(
            x.to_f32().expect("f32"),
            vec![1.0, -2.0, 0.5, 3.0, 0.0, 1.5]
        );
        assert_eq!(
            set.get("c").expect("c").to_u32().expect("u32"),
            vec![0xDEADBEEF]
        );
        assert!(set.get("x").expect("x").to_u32().is_err());
    }

    #[test]
    fn truncated_file_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("bad.safetensors");
        std::fs::write(&p, 100u64.to_le_bytes()).expect("write");
        let e = SafetensorsFile::open(&p)
            .expect_err("must fail")
            .to_string();
        assert!(
            e.contains("bad.safetensors") && e.contains("exceeds"),
            "{e}"
        );
    }
}
