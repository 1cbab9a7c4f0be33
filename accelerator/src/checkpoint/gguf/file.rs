//! Parsing a GGUF file's header: magic, version, metadata and tensor infos, over one mapping.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{MmapMut, MmapOptions};

use super::error::GgufError;
use super::meta::{self, ListError, MetaValue};
use super::types::GgmlType;

const MAGIC: &[u8; 4] = b"GGUF";
/// The alignment of the data section (and of each tensor in it) when `general.alignment` is
/// not set.
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// How deep arrays of arrays may nest: no converter writes more than one level, and a crafted
/// file must not exhaust the stack.
const MAX_NESTING: u32 = 8;
/// The fewest bytes a tensor info takes: a name's length (8), a dim count (4), one dim (8), a
/// type (4) and an offset (8).
const MIN_INFO_BYTES: u64 = 32;

/// Where one tensor lives in the data section, as the file describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// Dimensions, fastest-varying first (ggml's `ne`): an `[out, in]` matrix is `[in, out]`.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset from the start of the data section.
    pub offset: u64,
}

impl GgufTensorInfo {
    /// The row-major shape (the dims reversed), as MLX and Hugging Face write it.
    pub fn shape(&self) -> Vec<i32> {
        // `open` checked that every dim fits an i32.
        self.dims.iter().rev().map(|&d| d as i32).collect()
    }

    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Length of the contiguous rows the blocks run along (the fastest-varying dim).
    pub fn row_length(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Bytes the tensor takes in the file; `None` for a type of unknown size.
    pub fn stored_bytes(&self) -> Option<u64> {
        let (block, bytes) = self.ggml_type.block()?;
        Some(self.elements() / block * bytes)
    }
}

/// A GGUF file, memory-mapped and its header parsed once.
///
/// The mapping is private (copy-on-write), as for safetensors: MLX may write into a buffer it
/// was handed, and that must never reach the file.
#[derive(Debug)]
pub struct GgufFile {
    pub(super) path: PathBuf,
    pub(super) map: Arc<MmapMut>,
    version: u32,
    metadata: BTreeMap<String, MetaValue>,
    /// In file order (the order converters write, which the loaders' progress follows).
    infos: Vec<GgufTensorInfo>,
    by_name: BTreeMap<String, usize>,
    /// Absolute offset of the data section.
    pub(super) data_start: u64,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: a private mapping; the file must not be truncated while loaded (the same
        // assumption every memory-mapped model loader makes).
        let map = unsafe { MmapOptions::new().map_copy(&file) }.map_err(io)?;
        Self::parse(path.to_path_buf(), map)
    }

    /// Whether the file starts with GGUF's magic (reads four bytes; any error reads as no).
    pub fn is_gguf(path: &Path) -> bool {
        let mut magic = [0u8; 4];
        File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok()
            && &magic == MAGIC
    }

    fn parse(path: PathBuf, map: MmapMut) -> Result<GgufFile, GgufError> {
        let mut r = Reader {
            bytes: &map,
            at: 0,
            path: &path,
        };
        let magic = r.take(4, "the magic")?;
        if magic != MAGIC {
            return Err(r.fail_at(
                0,
                format!("it starts with {magic:02x?}, not the magic \"GGUF\""),
            ));
        }
        let version = r.u32("the version")?;
        if version != 2 && version != 3 {
            let why = if matches!(version.swap_bytes(), 2 | 3) {
                "a big-endian GGUF file; only little-endian ones are read".to_owned()
            } else {
                format!("GGUF version {version}; only versions 2 and 3 are read")
            };
            return Err(r.fail_at(4, why));
        }
        let tensor_count = r.u64("the tensor count")?;
        let kv_count = r.u64("the metadata count")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = r.string("a metadata key")?;
            let kind = r.u32("a metadata value type")?;
            let value = r.value(kind, &format!("the value of {key}"), 0)?;
            metadata.insert(key, value);
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => {
                    return Err(GgufError::Metadata {
                        path: path.clone(),
                        key: "general.alignment".into(),
                        why: format!("{v:?} is not a power of two"),
                    })
                }
            },
        };
        let mut infos = Vec::new();
        let mut by_name = BTreeMap::new();
        // A tensor info takes at least a name's length, a dim count, a dim, a type and an
        // offset: a count the rest of the file cannot hold is refused before any is read.
        let left = (r.bytes.len() - r.at) as u64;
        if tensor_count > left / MIN_INFO_BYTES {
            return Err(r.fail_at(
                16,
                format!(
                    "truncated: the header claims {tensor_count} tensors, whose infos alone \
                     would take at least {} bytes; {left} are left in the file",
                    tensor_count.saturating_mul(MIN_INFO_BYTES)
                ),
            ));
        }
        for index in 0..tensor_count {
            let start = r.at;
            let info = r.tensor_info().map_err(|e| match e {
                GgufError::Format { path, offset, why } => GgufError::Format {
                    path,
                    offset,
                    why: format!(
                        "the header claims {tensor_count} tensors; the info of tensor \
                         {} of them does not read: {why}",
                        index + 1
                    ),
                },
                other => other,
            })?;
            if info.offset % alignment != 0 {
                return Err(r.fail_at(
                    start as u64,
                    format!(
                        "tensor {} starts at data offset {}, not a multiple of the file's \
                         alignment {alignment}",
                        info.name, info.offset
                    ),
                ));
            }
            if by_name.insert(info.name.clone(), infos.len()).is_some() {
                return Err(r.fail_at(start as u64, format!("tensor {} twice", info.name)));
            }
            infos.push(info);
        }
        let data_start = (r.at as u64).div_ceil(alignment) * alignment;
        let file = GgufFile {
            path,
            version,
            metadata,
            infos,
            by_name,
            data_start,
            map: Arc::new(map),
        };
        for info in &file.infos {
            file.check_extent(info)?;
        }
        file.check_overlaps()?;
        Ok(file)
    }

    /// Refuses tensors whose bytes run into the next tensor's: the size its type and shape
    /// give it is not the room the file left it (a damaged or hand-edited header; loading it
    /// would read another tensor's bytes as its own).
    fn check_overlaps(&self) -> Result<(), GgufError> {
        let mut by_offset: Vec<&GgufTensorInfo> = self.infos.iter().collect();
        by_offset.sort_by_key(|info| info.offset);
        for pair in by_offset.windows(2) {
            let (this, next) = (pair[0], pair[1]);
            // Unknown types have no size to check (they are refused when loaded).
            let Some(size) = this.stored_bytes() else {
                continue;
            };
            if this.offset.saturating_add(size) > next.offset {
                return Err(self.tensor_error(
                    this,
                    format!(
                        "as {} of shape {:?} it takes {size} bytes, which run into tensor {} \
                         at data offset {}: its byte length does not match its type and shape",
                        this.ggml_type,
                        this.shape(),
                        next.name,
                        next.offset
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Refuses a tensor whose bytes are not all in the file, or whose rows do not split into
    /// whole blocks (the loaders assume both).
    fn check_extent(&self, info: &GgufTensorInfo) -> Result<(), GgufError> {
        let fail = |why: String| self.tensor_error(info, why);
        let Some((block, bytes)) = info.ggml_type.block() else {
            // Unknown types are refused when loaded; their size is unknown, so it stays unchecked.
            return Ok(());
        };
        if info.row_length() % block != 0 {
            return Err(fail(format!(
                "row length {} is not a multiple of the type's block of {block}",
                info.row_length()
            )));
        }
        let size = (info.elements() / block)
            .checked_mul(bytes)
            .ok_or_else(|| fail("its size overflows".into()))?;
        let end = self
            .data_start
            .checked_add(info.offset)
            .and_then(|s| s.checked_add(size))
            .ok_or_else(|| fail("its extent overflows".into()))?;
        let len = self.map.len() as u64;
        if end > len {
            return Err(fail(format!(
                "its {size} bytes end at byte {end}, past the end of the file ({len} bytes): \
                 the file is truncated"
            )));
        }
        Ok(())
    }

    pub(crate) fn tensor_error(&self, info: &GgufTensorInfo, why: String) -> GgufError {
        GgufError::Tensor {
            path: self.path.clone(),
            name: info.name.clone(),
            ggml_type: info.ggml_type,
            offset: info.offset,
            why,
        }
    }

    /// The stored bytes of a tensor of known type (checked in bounds at open).
    pub(super) fn bytes_of(&self, info: &GgufTensorInfo) -> &[u8] {
        let size = info.stored_bytes().unwrap_or(0) as usize;
        let start = (self.data_start + info.offset) as usize;
        &self.map[start..start + size]
    }

    /// Gives the pages that lie wholly inside `info`'s bytes back to the kernel (they were read
    /// into memory by the load; what was made of them holds no reference to them). The
    /// mapping stays valid: a later read of those bytes reads them from the file again, the
    /// same bytes, since no one writes into a tensor that was packed. Pages shared with a
    /// neighbouring tensor stay.
    pub(super) fn release(&self, info: &GgufTensorInfo) {
        let bytes = self.bytes_of(info);
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let Ok(page) = usize::try_from(page) else {
            return;
        };
        if page == 0 {
            return;
        }
        let start = (bytes.as_ptr() as usize).div_ceil(page) * page;
        let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
        if end > start {
            // SAFETY: [start, end) is whole pages inside this file's private mapping, which
            // lives as long as `self`; MADV_DONTNEED on a private file mapping drops the pages
            // and later accesses read the file again. Nothing holds a write into them (see
            // above), so nothing is lost. A failure only leaves the pages resident.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    pub fn string(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// Any integer type holding a non-negative value.
    pub fn uint(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// A float, or an integer read as one.
    pub fn float(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    pub fn boolean(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    /// `general.architecture` (`llama`, `qwen3`, `gemma3`, …).
    pub fn architecture(&self) -> Option<&str> {
        self.string("general.architecture")
    }

    /// The array `key` as strings (`tokenizer.ggml.tokens`, `tokenizer.ggml.merges`).
    pub fn strings(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.list(key, "strings", MetaValue::as_str)
    }

    /// The array `key` as i32s, from any integer type in range (`tokenizer.ggml.token_type`).
    pub fn i32s(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.list(key, "32-bit integers", |v| i32::try_from(v.as_i64()?).ok())
    }

    /// The array `key` as f32s, from f32 or f64 (`tokenizer.ggml.scores`).
    pub fn f32s(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.list(key, "floats", |v| match *v {
            MetaValue::F32(x) => Some(x),
            MetaValue::F64(x) => Some(x as f32),
            _ => None,
        })
    }

    fn list<'a, T>(
        &'a self,
        key: &str,
        wanted: &str,
        each: impl Fn(&'a MetaValue) -> Option<T>,
    ) -> Result<Vec<T>, GgufError> {
        meta::list(self.get(key), each).map_err(|e| GgufError::Metadata {
            path: self.path.clone(),
            key: key.to_owned(),
            why: match e {
                ListError::Missing => "not in the file".into(),
                ListError::NotArray(t) => format!("a {t}, not an array of {wanted}"),
                ListError::Element { index, found } => {
                    format!("element {index} is a {found}, not one of the {wanted} expected")
                }
            },
        })
    }

    /// The tensors, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = &GgufTensorInfo> {
        self.infos.iter()
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.infos[i])
    }
}

/// A cursor over the header bytes whose every read says what it was reading when it fails.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn fail_at(&self, offset: u64, why: String) -> GgufError {
        GgufError::Format {
            path: self.path.to_path_buf(),
            offset,
            why,
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        let left = self.bytes.len() - self.at;
        if n > left {
            return Err(self.fail_at(
                self.at as u64,
                format!(
                    "truncated: {what} needs {n} bytes, {left} are left of {}",
                    self.bytes.len()
                ),
            ));
        }
        let slice = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let start = self.at as u64;
        let len = self.u64(what)?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.fail_at(start, format!("{what} is not UTF-8 ({e})"))),
        }
    }

    /// One value of GGUF type `kind`; `what` names it in messages (built once per key, not
    /// per element: a vocabulary is an array of up to a quarter million strings).
    fn value(&mut self, kind: u32, what: &str, depth: u32) -> Result<MetaValue, GgufError> {
        Ok(match kind {
            0 => MetaValue::U8(u8::from_le_bytes(self.array(what)?)),
            1 => MetaValue::I8(i8::from_le_bytes(self.array(what)?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(what)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            7 => {
                let [b] = self.array(what)?;
                if b > 1 {
                    return Err(self.fail_at(
                        self.at as u64 - 1,
                        format!("{what} is a bool stored as {b}, not 0 or 1"),
                    ));
                }
                MetaValue::Bool(b == 1)
            }
            8 => MetaValue::String(self.string(what)?),
            9 => {
                let start = self.at as u64;
                if depth >= MAX_NESTING {
                    return Err(self.fail_at(
                        start,
                        format!("{what} nests arrays deeper than {MAX_NESTING}"),
                    ));
                }
                let elem = self.u32(what)?;
                let count = self.u64(what)?;
                // Every element takes at least one byte: a count the rest of the file cannot
                // hold is refused before anything is allocated for it.
                let left = (self.bytes.len() - self.at) as u64;
                if count > left {
                    return Err(self.fail_at(
                        start,
                        format!(
                            "truncated: {what} is an array of {count} elements, \
                             {left} bytes are left"
                        ),
                    ));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, what, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.array(what)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            other => {
                return Err(self.fail_at(
                    self.at as u64 - 4,
                    format!("{what} has unknown value type {other} (GGUF defines 0 to 12)"),
                ))
            }
        })
    }

    fn tensor_info(&mut self) -> Result<GgufTensorInfo, GgufError> {
        let name = self.string("a tensor name")?;
        let what = format!("the info of tensor {name}");
        let at = self.at as u64;
        let n_dims = self.u32(&what)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(self.fail_at(
                at,
                format!("tensor {name} has {n_dims} dimensions; ggml allows 1 to {MAX_DIMS}"),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        let mut elements: u64 = 1;
        for _ in 0..n_dims {
            let at = self.at as u64;
            let d = self.u64(&what)?;
            elements = elements.saturating_mul(d);
            // MLX shapes are i32, and so is the element count it indexes with.
            if d > i32::MAX as u64 || elements > i32::MAX as u64 {
                return Err(self.fail_at(
                    at,
                    format!("tensor {name} has dims {dims:?} then {d}: too large for MLX"),
                ));
            }
            dims.push(d);
        }
        let ggml_type = GgmlType::from_id(self.u32(&what)?);
        let offset = self.u64(&what)?;
        Ok(GgufTensorInfo {
            name,
            dims,
            ggml_type,
            offset,
        })
    }
}
