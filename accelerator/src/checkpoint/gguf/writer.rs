//! A minimal GGUF writer for this module's tests (the integration test reads a fixture that
//! gguf-py wrote instead, so the reader is not only checked against itself).

use super::meta::MetaValue;

/// One tensor to write: name, dims (fastest-varying first), ggml type id and its bytes.
pub struct Tensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub bytes: Vec<u8>,
}

pub struct Writer {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<Tensor>,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.extend(x.to_le_bytes()),
        MetaValue::I8(x) => out.extend(x.to_le_bytes()),
        MetaValue::U16(x) => out.extend(x.to_le_bytes()),
        MetaValue::I16(x) => out.extend(x.to_le_bytes()),
        MetaValue::U32(x) => out.extend(x.to_le_bytes()),
        MetaValue::I32(x) => out.extend(x.to_le_bytes()),
        MetaValue::U64(x) => out.extend(x.to_le_bytes()),
        MetaValue::I64(x) => out.extend(x.to_le_bytes()),
        MetaValue::F32(x) => out.extend(x.to_le_bytes()),
        MetaValue::F64(x) => out.extend(x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => string(out, s),
        MetaValue::Array(items) => {
            // An empty array's element type is arbitrary; u8 is what gguf-py writes.
            out.extend(items.first().map_or(0, type_id).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                value(out, item);
            }
        }
    }
}

impl Writer {
    pub fn new() -> Self {
        Writer {
            version: 3,
            alignment: 32,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Every key and tensor of `file`, to be written again (with more keys: [`meta`](Self::meta)).
    pub fn copy_of(file: &super::GgufFile) -> Self {
        let mut writer = Writer::new();
        for (key, value) in file.metadata() {
            writer = writer.meta(key, value.clone());
        }
        for info in file.tensors() {
            let bytes = file.bytes_of(info).to_vec();
            writer = writer.tensor(&info.name, &info.dims, info.ggml_type.id(), bytes);
        }
        writer
    }

    pub fn meta(mut self, key: &str, v: MetaValue) -> Self {
        self.metadata.push((key.to_owned(), v));
        self
    }

    /// The key set to `v`, in place where the file has it, else added.
    pub fn set_meta(mut self, key: &str, v: MetaValue) -> Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = v,
            None => self.metadata.push((key.to_owned(), v)),
        }
        self
    }

    /// Without the key.
    pub fn without_meta(mut self, key: &str) -> Self {
        self.metadata.retain(|(k, _)| k != key);
        self
    }

    /// Without the tensor.
    pub fn without_tensor(mut self, name: &str) -> Self {
        self.tensors.retain(|t| t.name != name);
        self
    }

    pub fn tensor(mut self, name: &str, dims: &[u64], ggml_type: u32, bytes: Vec<u8>) -> Self {
        self.tensors.push(Tensor {
            name: name.to_owned(),
            dims: dims.to_vec(),
            ggml_type,
            bytes,
        });
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            string(&mut out, k);
            out.extend(type_id(v).to_le_bytes());
            value(&mut out, v);
        }
        let align = |n: u64| n.div_ceil(self.alignment) * self.alignment;
        let mut offset = 0u64;
        for t in &self.tensors {
            string(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ggml_type.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset = align(offset + t.bytes.len() as u64);
        }
        let data_start = align(out.len() as u64);
        out.resize(data_start as usize, 0);
        for t in &self.tensors {
            out.extend(&t.bytes);
            out.resize(align(out.len() as u64) as usize, 0);
        }
        out
    }

    /// Writes the file into `dir` and returns its path.
    pub fn write(&self, dir: &std::path::Path, name: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.bytes()).expect("write a test GGUF");
        path
    }
}
