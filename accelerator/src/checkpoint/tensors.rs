//! The project's one safetensors reader: memory-mapped files and their tensors by name.
//!
//! The reader hands out [`TensorView`]s that borrow the mapping, and the mapping itself
//! ([`SafetensorsFile::mapping`]) so a loader can build device arrays over the mapped bytes
//! without a copy. The header is parsed here (an 8-byte little-endian length and a JSON object)
//! so errors can name the file and the tensor, and say when a file is cut short.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{MmapMut, MmapOptions};
use serde::{Deserialize, Serialize};

#[allow(non_camel_case_types)]
/// Element types of the safetensors format (all of them, so any file's header parses; the
/// layouts use F32, F16, BF16, U32 and U8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dtype {
    F64,
    F32,
    F16,
    BF16,
    F8_E4M3,
    F8_E5M2,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
    BOOL,
}

/// Every dtype with its safetensors name and size in bytes.
const DTYPES: [(Dtype, &str, usize); 15] = [
    (Dtype::F64, "F64", 8),
    (Dtype::F32, "F32", 4),
    (Dtype::F16, "F16", 2),
    (Dtype::BF16, "BF16", 2),
    (Dtype::F8_E4M3, "F8_E4M3", 1),
    (Dtype::F8_E5M2, "F8_E5M2", 1),
    (Dtype::I64, "I64", 8),
    (Dtype::I32, "I32", 4),
    (Dtype::I16, "I16", 2),
    (Dtype::I8, "I8", 1),
    (Dtype::U64, "U64", 8),
    (Dtype::U32, "U32", 4),
    (Dtype::U16, "U16", 2),
    (Dtype::U8, "U8", 1),
    (Dtype::BOOL, "BOOL", 1),
];

impl Dtype {
    fn entry(self) -> (Dtype, &'static str, usize) {
        DTYPES
            .into_iter()
            .find(|(d, _, _)| *d == self)
            .unwrap_or((self, "?", 1))
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        self.entry().2
    }

    /// The safetensors spelling (`BF16`, `U32`, …).
    pub fn name(self) -> &'static str {
        self.entry().1
    }

    /// Whether this is one of the float types a dense weight may be stored in.
    pub fn is_weight_float(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F16 | Dtype::BF16)
    }

    fn parse(s: &str) -> Option<Dtype> {
        DTYPES
            .into_iter()
            .find(|(_, n, _)| *n == s)
            .map(|(d, _, _)| d)
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
    #[error("{path}: {why}")]
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
///
/// The mapping is private (copy-on-write): MLX may donate an input buffer to an output and write
/// into it; with a private mapping that copies only the touched pages, never the file.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    mmap: Arc<MmapMut>,
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
        // SAFETY: a private mapping; the file must not be truncated while loaded (the same
        // assumption every memory-mapped model loader makes).
        let mmap = unsafe { MmapOptions::new().map_copy(&file) }.map_err(io_err(&path))?;
        let bad = |why: String| TensorError::BadHeader {
            path: path.clone(),
            why,
        };
        let len = mmap.len() as u64;
        if len < 8 {
            return Err(bad(format!(
                "truncated: {len} bytes, shorter than the 8-byte header length"
            )));
        }
        let mut len8 = [0u8; 8];
        len8.copy_from_slice(&mmap[..8]);
        let hlen = u64::from_le_bytes(len8);
        if hlen > MAX_HEADER {
            return Err(bad(format!(
                "header length {hlen} exceeds the format's limit of {MAX_HEADER} bytes"
            )));
        }
        if 8 + hlen > len {
            return Err(bad(format!(
                "truncated: {len} bytes, but its header alone takes {}",
                8 + hlen
            )));
        }
        let data_start = 8 + hlen as usize;
        let header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&mmap[8..data_start]).map_err(|e| bad(e.to_string()))?;
        // A file shorter than its header says is named truncated before any tensor is judged.
        let data_end = header
            .iter()
            .filter(|(name, _)| name.as_str() != "__metadata__")
            .filter_map(|(_, t)| t.get("data_offsets")?.get(1)?.as_u64())
            .max()
            .unwrap_or(0);
        let expected = data_start as u64 + data_end;
        if len < expected {
            return Err(bad(format!(
                "truncated: {len} bytes, but its header describes {expected} ({} missing)",
                expected - len
            )));
        }
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
            mmap: Arc::new(mmap),
            tensors,
            metadata,
        })
    }

    /// The mapping, for building arrays over the mapped bytes (keep a clone for as long as such
    /// an array lives).
    pub fn mapping(&self) -> &Arc<MmapMut> {
        &self.mmap
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

/// Largest header the safetensors format allows; a bigger length prefix means the file is not
/// safetensors at all, not that it is cut short.
const MAX_HEADER: u64 = 100_000_000;

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

    /// Bytes of tensor data in all files.
    pub fn data_bytes(&self) -> u64 {
        self.files
            .iter()
            .flat_map(|f| f.tensors.values())
            .map(|t| (t.end - t.start) as u64)
            .sum()
    }
}

/// One tensor as planned or expected: its name, element type and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file of one 4×4 f32 tensor of zeros, written by hand.
    fn small_file() -> Vec<u8> {
        let mut header = br#"{"w":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]}}"#.to_vec();
        while header.len() % 8 != 0 {
            header.push(b' ');
        }
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header);
        bytes.extend([0u8; 64]);
        bytes
    }

    #[test]
    fn reads_a_file_and_names_a_truncated_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("bad.safetensors");
        let bytes = small_file();
        std::fs::write(&p, &bytes).expect("write");
        let f = SafetensorsFile::open(&p).expect("opens");
        let w = f.tensor("w").expect("w");
        assert_eq!((w.dtype, w.shape), (Dtype::F32, &[4usize, 4][..]));
        assert_eq!(w.to_f32().expect("f32"), vec![0.0; 16]);
        assert!(w.to_u32().is_err());
        drop(f);
        let full = bytes.len();
        let open_err = |b: &[u8]| {
            std::fs::write(&p, b).expect("write");
            SafetensorsFile::open(&p)
                .expect_err("must fail")
                .to_string()
        };
        let e = open_err(&bytes[..full - 10]);
        assert!(e.starts_with(&p.display().to_string()), "{e}");
        assert!(
            e.contains(&format!(
                "truncated: {} bytes, but its header describes {full} (10 missing)",
                full - 10
            )),
            "{e}"
        );
        assert!(open_err(&bytes[..20]).contains("truncated: 20 bytes, but its header alone takes"),);
        assert!(open_err(&bytes[..5]).contains("truncated: 5 bytes, shorter than the 8-byte"));
        assert!(open_err(&[0xff; 64]).contains("exceeds the format's limit"));
    }
}
